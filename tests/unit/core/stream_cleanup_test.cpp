// The registry behind OwnedStream's release of per-stream caches (white-box: the registry is
// internal; its use by the cuBLASLt workspace is tested in tests/gpu/gemm_gpu_test.cpp).
#include "core/stream_cleanup.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace qmesh::detail {
namespace {

// Stand-ins for stream handles: the registry only compares them.
int stream_a, stream_b;

TEST(StreamCleanup, RunsTheStreamsCleanupsOnceInOrder) {
  std::vector<int> ran;
  at_stream_destroy(&stream_a, [&] { ran.push_back(1); });
  at_stream_destroy(&stream_b, [&] { ran.push_back(10); });
  at_stream_destroy(&stream_a, [&] { ran.push_back(2); });
  run_stream_cleanups(&stream_a);
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  run_stream_cleanups(&stream_a);  // forgotten after running
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  run_stream_cleanups(&stream_b);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 10}));
}

TEST(StreamCleanup, AThrowingCleanupDoesNotStopTheOthers) {
  std::vector<int> ran;
  at_stream_destroy(&stream_a, [] { throw std::runtime_error("cudaFree failed"); });
  at_stream_destroy(&stream_a, [&] { ran.push_back(2); });
  EXPECT_NO_THROW(run_stream_cleanups(&stream_a));
  EXPECT_EQ(ran, (std::vector<int>{2}));
}

TEST(StreamCleanup, AStreamWithoutCleanupsIsANoOp) {
  EXPECT_NO_THROW(run_stream_cleanups(&stream_b));
}

}  // namespace
}  // namespace qmesh::detail
