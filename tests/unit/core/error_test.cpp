#include "qmesh/error.h"

#include <gtest/gtest.h>

#include "qmesh/logging.h"

namespace qmesh {
namespace {

TEST(Error, CheckCarriesFileLineConditionAndMessage) {
  const int line = __LINE__ + 2;
  try {
    QMESH_CHECK(1 + 1 == 3, "arithmetic is broken: ", 42);
    FAIL() << "QMESH_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.file(), "error_test.cpp");
    EXPECT_EQ(e.line(), line);
    EXPECT_EQ(e.call(), "1 + 1 == 3");
    EXPECT_EQ(e.message(), "arithmetic is broken: 42");
    const std::string what = e.what();
    EXPECT_NE(what.find("error_test.cpp:" + std::to_string(line)), std::string::npos) << what;
    EXPECT_NE(what.find("[failed: 1 + 1 == 3]"), std::string::npos) << what;
  }
}

TEST(Error, LibraryMessageAppearsInWhat) {
  const Error e("NCCL call failed", "/a/b/c.cpp", 7, "ncclAllReduce(...)",
                "unhandled system error");
  EXPECT_STREQ(e.what(),
               "qmesh error at c.cpp:7: NCCL call failed [failed: ncclAllReduce(...)] "
               "[unhandled system error]");
}

TEST(Error, ChecksAndThrowsAreInvalidArgumentsUnlessGivenAKind) {
  try {
    QMESH_CHECK(false, "bad size");
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
  try {
    QMESH_THROW("bad dtype");
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
  const int line = __LINE__ + 2;
  try {
    QMESH_CHECK_KIND(ErrorKind::kUnsupported, 2 < 1, "built without ", "MPI");
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.call(), "2 < 1");
    EXPECT_EQ(e.message(), "built without MPI");
    EXPECT_EQ(e.line(), line);
  }
  try {
    QMESH_THROW_KIND(ErrorKind::kTimeout, "waited ", 5, " s");
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_EQ(e.message(), "waited 5 s");
  }
  EXPECT_EQ(Error(ErrorKind::kRuntime, "NCCL call failed", "x.cpp", 1).kind(), ErrorKind::kRuntime);
  EXPECT_EQ(Error("plain", "x.cpp", 1).kind(), ErrorKind::kInvalidArgument);
}

TEST(Error, KindsHaveNames) {
  EXPECT_STREQ(error_kind_name(ErrorKind::kInvalidArgument), "invalid argument");
  EXPECT_STREQ(error_kind_name(ErrorKind::kUnsupported), "unsupported");
  EXPECT_STREQ(error_kind_name(ErrorKind::kTimeout), "timeout");
  EXPECT_STREQ(error_kind_name(ErrorKind::kRuntime), "runtime");
}

TEST(Error, PassingCheckDoesNotThrow) { EXPECT_NO_THROW(QMESH_CHECK(true, "unused")); }

TEST(Logging, LevelFromEnvironmentAndBadValue) {
  set_log_level(LogLevel::kInfo);
  EXPECT_EQ(log_level(), LogLevel::kInfo);
  testing::internal::CaptureStderr();
  QMESH_LOG_INFO("hello ", 3);
  QMESH_LOG_DEBUG("hidden");
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("qmesh INFO error_test.cpp:"), std::string::npos) << out;
  EXPECT_NE(out.find("hello 3"), std::string::npos) << out;
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
}

}  // namespace
}  // namespace qmesh
