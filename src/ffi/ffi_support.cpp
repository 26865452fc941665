#include "ffi/ffi_support.h"

#include "qmesh/copy.h"

namespace qmesh::ffi {

xffi::ErrorCode error_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return xffi::ErrorCode::kInvalidArgument;
    case ErrorKind::kUnsupported:
      return xffi::ErrorCode::kUnimplemented;
    case ErrorKind::kTimeout:
      return xffi::ErrorCode::kDeadlineExceeded;
    case ErrorKind::kRuntime:
      return xffi::ErrorCode::kInternal;
  }
  return xffi::ErrorCode::kInternal;
}

void require_rank(const AnyBuffer& buffer, size_t rank, const std::string& what) {
  QMESH_CHECK(buffer.dimensions().size() == rank, what, " must have rank ", rank, ", got rank ",
              buffer.dimensions().size());
}

GemmOperand gemm_operand(const Where& w, const AnyBuffer& x, const AnyBuffer& scale_inv,
                         int32_t block, const char* what, const char* scale_what, size_t rank) {
  require_rank(x, rank, what);
  const TensorView v = view(x, w, what);
  QMESH_CHECK(block >= 0 && block <= 2,
              "the block scaling of an operand must be 0 (per tensor), 1 (1x128) or 2 "
              "(128x128), not ",
              block);
  QMESH_CHECK(block == 0 || is_fp8(v.dtype), what,
              " is block-scaled but not FP8: only FP8 codes have block scales");
  if (block != 0) {
    BlockQuantizedTensorView q;
    q.block = block == 1 ? BlockShape::k1x128 : BlockShape::k128x128;
    q.data = v;
    q.scale_inv = view(scale_inv, w, scale_what);
    return GemmOperand::fp8_block(q);
  }
  if (!is_fp8(v.dtype)) return GemmOperand::plain(v);
  require_dtype(scale_inv, {DType::kFloat32}, scale_what);
  require_count(scale_inv, 1, scale_what);
  auto* s = static_cast<float*>(scale_inv.untyped_data());
  QuantizedTensorView q;
  q.data = v;
  q.scale = s;
  q.scale_inv = s;
  q.amax = s;
  return GemmOperand::fp8(q);
}

TensorView packed_view(const AnyBuffer& buffer, const Where& w, int64_t rows, const char* what) {
  QMESH_CHECK(buffer.element_type() == xffi::DataType::U8, what,
              " must be uint8 (two float4_e2m1fn codes per byte)");
  const int64_t n = element_count(buffer);
  QMESH_CHECK(rows > 0 && n > 0 && n % rows == 0, what, " must be [", rows, ", cols / 2], got ", n,
              " elements");
  return TensorView(buffer.untyped_data(), DType::kFloat4E2M1x2, Shape{rows, n / rows}, w.device);
}

DType to_dtype(xffi::DataType type, const std::string& what) {
  switch (type) {
    case xffi::DataType::F32:
      return DType::kFloat32;
    case xffi::DataType::F16:
      return DType::kFloat16;
    case xffi::DataType::BF16:
      return DType::kBFloat16;
    case xffi::DataType::F8E4M3FN:
      return DType::kFloat8E4M3;
    case xffi::DataType::F8E5M2:
      return DType::kFloat8E5M2;
    case xffi::DataType::S32:
      return DType::kInt32;
    case xffi::DataType::F64:
      return DType::kFloat64;
    case xffi::DataType::F8E8M0FNU:
      return DType::kFloat8E8M0;
    default:
      break;
  }
  QMESH_THROW(what, " has an element type qmesh does not take (XLA type ", int(type),
              "); use float32, bfloat16, float16, float8_e4m3fn, float8_e5m2, int32 or "
              "float8_e8m0fnu (MXFP8 scales)");
}

int64_t element_count(const AnyBuffer& buffer) {
  int64_t n = 1;
  for (int64_t d : buffer.dimensions()) n *= d;
  return n;
}

namespace {
TensorView make_view(void* data, xffi::DataType type, xffi::Span<const int64_t> dims,
                     const Where& where, const std::string& what) {
  std::vector<int64_t> shape(dims.begin(), dims.end());
  for (int64_t d : shape) QMESH_CHECK(d > 0, what, " is empty (a dimension is 0)");
  if (shape.empty()) shape.push_back(1);
  return TensorView(data, to_dtype(type, what), Shape(std::move(shape)), where.device);
}
}  // namespace

TensorView view(const AnyBuffer& buffer, const Where& where, const std::string& what) {
  return make_view(buffer.untyped_data(), buffer.element_type(), buffer.dimensions(), where, what);
}

TensorView view(Result<AnyBuffer>& buffer, const Where& where, const std::string& what) {
  return make_view(buffer->untyped_data(), buffer->element_type(), buffer->dimensions(), where,
                   what);
}

NvFp4Options nvfp4_transform(bool rht, int32_t rht_signs) {
  QMESH_CHECK(rht_signs >= 0 && rht_signs < 0x10000, "rht_signs must be a 16-bit mask, got ",
              rht_signs);
  NvFp4Options options;
  options.rht = rht;
  options.rht_signs = static_cast<uint16_t>(rht_signs);
  return options;
}

TensorView matrix_view(const AnyBuffer& x, const Where& where, const std::string& what) {
  const TensorView v = view(x, where, what);
  return TensorView(v.data, v.dtype, Shape{v.shape.rows(), v.shape.cols()}, where.device);
}

void require_dtype(const AnyBuffer& buffer, std::initializer_list<DType> allowed,
                   const std::string& what) {
  const DType d = to_dtype(buffer.element_type(), what);
  std::string names;
  for (DType a : allowed) {
    if (a == d) return;
    names += (names.empty() ? "" : ", ") + std::string(dtype_name(a));
  }
  QMESH_THROW(what, " has dtype ", dtype_name(d), "; expected one of: ", names);
}

void require_count(const AnyBuffer& buffer, int64_t count, const std::string& what) {
  QMESH_CHECK(element_count(buffer) == count, what, " must hold ", count, " element(s), not ",
              element_count(buffer));
}

std::vector<int32_t> group_rows(const Where& where, const AnyBuffer& sizes, int64_t rows,
                                int64_t row_block) {
  require_dtype(sizes, {DType::kInt32}, "group_sizes");
  std::vector<int32_t> counts(element_count(sizes));
  QMESH_CHECK(!counts.empty(), "group_sizes must list at least one group");
  copy_bytes_async(counts.data(), Device::host(), sizes.untyped_data(), where.device,
                   counts.size() * sizeof(int32_t), where.stream);
  synchronize(where.device, where.stream);
  int64_t total = 0;
  for (int32_t r : counts) {
    QMESH_CHECK(r >= 0, "group_sizes must not be negative, got ", r);
    total += r;
  }
  QMESH_CHECK(total == rows, "group_sizes add up to ", total, " rows but x has ", rows, " rows");
  for (size_t g = 0; g < counts.size(); ++g)
    QMESH_CHECK(counts[g] % row_block == 0, "group ", g, " has ", counts[g],
                " rows, not a multiple of ", row_block,
                ": every group's rows must be whole blocks; pad each group to a multiple of ",
                row_block, " rows");
  return counts;
}

void store_scalar(float* dst, float value, const Where& where) {
  if (where.device.is_host()) {
    *dst = value;
    return;
  }
  // Static storage: the stream-ordered copy may read the source after this call returns.
  static const float kZero = 0.0f, kOne = 1.0f;
  QMESH_CHECK(value == 0.0f || value == 1.0f, "store_scalar on a device takes 0 or 1, not ", value);
  copy_bytes_async(dst, where.device, value == 0.0f ? &kZero : &kOne, Device::host(), sizeof(float),
                   where.stream);
}

}  // namespace qmesh::ffi
