#include "layers/gather_buffer.h"

namespace qmesh {

GemmOperand GatherBuffer::get(const GemmOperand& chunk, int64_t rows, bool columnwise) {
  if (chunk.is_block_scaled()) {
    const Shape shape{rows, chunk.block.data.shape.cols()};
    if (!block_.data().data() || !(block_.shape() == shape) || block_.dtype() != chunk.dtype() ||
        block_.device() != chunk.device() || block_.block() != chunk.block.block)
      block_ = BlockQuantizedTensor(chunk.dtype(), shape, chunk.block.block, chunk.device(), false);
    return GemmOperand::fp8_block(block_.view());
  }
  if (chunk.is_quantized()) {
    const Shape shape{rows, chunk.quantized.data.shape.cols()};
    if (!fp8_.data().data() || !(fp8_.shape() == shape) || fp8_.dtype() != chunk.dtype() ||
        fp8_.device() != chunk.device() || fp8_.has_columnwise() != columnwise)
      fp8_ = QuantizedTensor(chunk.dtype(), shape, chunk.device(), columnwise);
    return GemmOperand::fp8(fp8_.view());
  }
  const Shape shape{rows, chunk.tensor.shape.cols()};
  if (!plain_.data() || !(plain_.shape() == shape) || plain_.dtype() != chunk.dtype() ||
      plain_.device() != chunk.device())
    plain_ = Tensor(chunk.dtype(), shape, chunk.device());
  return GemmOperand::plain(plain_);
}

}  // namespace qmesh
