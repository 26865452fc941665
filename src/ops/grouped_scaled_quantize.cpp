// grouped_mxfp8_quantize and grouped_nvfp4_quantize (ops/grouped_quantize.h): the non-grouped
// op on each group's rows (so host and CUDA give the same bits, as that op does).
#include <string>

#include "ops/check_wide.h"
#include "ops/group_split.h"
#include "qmesh/ops/grouped_quantize.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/ops/nvfp4_quantize.h"

namespace qmesh {

void grouped_mxfp8_quantize(const TensorView& x, std::span<const MxFp8TensorView> outs,
                            float margin, Stream stream) {
  detail::check_wide(x, "grouped_mxfp8_quantize input");
  detail::for_each_group(
      x, outs, kMxBlock, "grouped_mxfp8_quantize",
      [](const MxFp8TensorView& out) { return out.data.shape; },
      [&](size_t, const TensorView& group, const MxFp8TensorView& out) {
        mxfp8_quantize(group, out, margin, stream);
      });
}

uint64_t nvfp4_group_seed(uint64_t seed, int64_t group) {
  return seed + static_cast<uint64_t>(group) * 0x9E3779B97F4A7C15ull;
}

void grouped_nvfp4_quantize(const TensorView& x, std::span<const NvFp4TensorView> outs,
                            const NvFp4Options& options, Stream stream) {
  detail::check_wide(x, "grouped_nvfp4_quantize input");
  QMESH_CHECK(options.seed_key.empty(),
              "grouped_nvfp4_quantize takes its seed as options.seed (the groups' seeds are "
              "derived from it on the host), not options.seed_key");
  QMESH_CHECK(options.amax.empty() && options.columnwise_amax.empty() && options.origin.empty(),
              "grouped_nvfp4_quantize quantizes each group as a whole tensor with its own "
              "amaxes: leave options.amax, columnwise_amax and origin empty");
  detail::for_each_group(
      x, outs, kNvFp4Block, "grouped_nvfp4_quantize",
      [](const NvFp4TensorView& out) {
        return Shape{out.rows(), out.cols()};
      },
      [&](size_t g, const TensorView& group, const NvFp4TensorView& out) {
        NvFp4Options group_options = options;
        group_options.seed = nvfp4_group_seed(options.seed, static_cast<int64_t>(g));
        nvfp4_quantize(group, out, group_options, stream);
      });
}

}  // namespace qmesh
