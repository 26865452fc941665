// detail::dispatch and detail::on_cuda (qmesh/detail/cuda_dispatch.h): which branch runs, and
// the device check before a CUDA branch. That a build without CUDA links although its CUDA
// branches name undefined entry points is shown by every such build of the library.
#include "qmesh/detail/cuda_dispatch.h"

#include <gtest/gtest.h>

#include "expect_error.h"

namespace qmesh {
namespace {

TEST(CudaDispatch, HostDeviceRunsTheHostBranchOnly) {
  int host = 0, cuda = 0;
  detail::dispatch(
      Device::host(), [&] { ++host; }, [&](auto) { ++cuda; });
  EXPECT_EQ(host, 1);
  EXPECT_EQ(cuda, 0);
}

TEST(CudaDispatch, UnusableDeviceIsRefusedBeforeEitherBranch) {
  const Device missing = Device::cuda(cuda_device_count());  // one past the last device
  int calls = 0;
  EXPECT_QMESH_ERROR(detail::dispatch(
                         missing, [&] { ++calls; }, [&](auto) { ++calls; }),
                     detail::kWithCuda ? "is not available" : "built with QMESH_WITH_CUDA=OFF");
  EXPECT_EQ(calls, 0);
}

TEST(CudaDispatch, OnCudaCallsTheBranchOnlyInACudaBuild) {
  int seen = -1;
  detail::on_cuda(3, [&](auto index) { seen = index; });
  EXPECT_EQ(seen, detail::kWithCuda ? 3 : -1);
}

}  // namespace
}  // namespace qmesh
