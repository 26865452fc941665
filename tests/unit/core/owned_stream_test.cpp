// OwnedStream's argument checks (streams on a GPU are tested in tests/gpu/loss_gpu_test.cpp).
#include "qmesh/owned_stream.h"

#include <gtest/gtest.h>

#include "expect_error.h"

namespace qmesh {
namespace {

TEST(OwnedStream, NeedsAUsableCudaDevice) {
  EXPECT_QMESH_ERROR(OwnedStream(Device::host()), "needs a CUDA device");
  const int count = cuda_device_count();
  EXPECT_QMESH_ERROR(OwnedStream(Device::cuda(count)), "not available");
}

}  // namespace
}  // namespace qmesh
