// ring_device.h in a build without CUDA: the rings reach these functions only for CUDA
// tensors, which such a build refuses first, so each one that could act throws.
#include "qmesh/error.h"
#include "ring_device.h"

namespace qmesh::overlap_detail {

namespace {
[[noreturn]] void no_cuda() {
  QMESH_THROW_KIND(ErrorKind::kUnsupported,
                   "collective GEMM on CUDA tensors: this build of qmesh has no CUDA support "
                   "(configure with QMESH_WITH_CUDA=ON)");
}
}  // namespace

void* record_event(Stream) { no_cuda(); }
void wait_event(Stream, void*) { no_cuda(); }
void destroy_event(void*) noexcept {}
void join_streams(Stream, Stream) noexcept {}
void* alloc_async(size_t, Stream) { no_cuda(); }
void free_async(void*, Stream) noexcept {}
void copy_async(void*, const void*, size_t, Stream) { no_cuda(); }
void zero_async(void*, size_t, Stream) { no_cuda(); }
void add_fp32_async(float*, const float*, const float*, int64_t, Stream) { no_cuda(); }
void max_fp32_async(float*, const float*, int, int, Stream) { no_cuda(); }
void poison_unless_same_async(const float*, int, int, void*, int64_t, int, uint32_t, float*,
                              Stream) {
  no_cuda();
}

}  // namespace qmesh::overlap_detail
