// EXPECT_QMESH_ERROR(statement, "substring"): the statement throws qmesh::Error whose
// message contains the substring (so tests check that errors say something useful).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "qmesh/error.h"

#define EXPECT_QMESH_ERROR(statement, substring)                                     \
  do {                                                                               \
    try {                                                                            \
      statement;                                                                     \
      ADD_FAILURE() << "expected qmesh::Error containing \"" << (substring)          \
                    << "\", nothing was thrown";                                     \
    } catch (const ::qmesh::Error& qmesh_error_) {                                   \
      EXPECT_NE(std::string(qmesh_error_.what()).find(substring), std::string::npos) \
          << "message was: " << qmesh_error_.what();                                 \
    }                                                                                \
  } while (0)
