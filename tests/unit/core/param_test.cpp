#include "qmesh/param.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "expect_error.h"

namespace qmesh {
namespace {

QMESH_PARAM(test_knob, "TEST_KNOB", 17)

TEST(Param, DefaultWhenUnsetOrEmpty) {
  unsetenv("QMESH_TEST_KNOB");
  EXPECT_EQ(test_knob(), 17);
  setenv("QMESH_TEST_KNOB", "", 1);
  EXPECT_EQ(test_knob(), 17);
}

TEST(Param, ParsesIntegersDoublesStrings) {
  setenv("QMESH_TEST_KNOB", "-5", 1);
  EXPECT_EQ(test_knob(), -5);
  setenv("QMESH_TEST_D", "2.5", 1);
  EXPECT_DOUBLE_EQ(param_double("TEST_D", 1.0), 2.5);
  setenv("QMESH_TEST_S", "abc", 1);
  EXPECT_EQ(param_string("TEST_S", "x"), "abc");
  EXPECT_EQ(param_string("TEST_UNSET_S", "x"), "x");
  unsetenv("QMESH_TEST_KNOB");
}

TEST(Param, GarbageIsAnErrorNamingTheVariable) {
  setenv("QMESH_TEST_KNOB", "12abc", 1);
  EXPECT_QMESH_ERROR(test_knob(), "QMESH_TEST_KNOB='12abc' is not an integer");
  setenv("QMESH_TEST_D", "fast", 1);
  EXPECT_QMESH_ERROR(param_double("TEST_D", 1.0), "QMESH_TEST_D='fast' is not a number");
  unsetenv("QMESH_TEST_KNOB");
  unsetenv("QMESH_TEST_D");
}

}  // namespace
}  // namespace qmesh
