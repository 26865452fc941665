#include "algorithms/reduce.h"

#include <cmath>
#include <cstring>

#include "qmesh/error.h"
#include "qmesh/float16.h"

namespace qmesh::algorithms {

namespace {

template <class T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_floating_point_v<T>) {
    if (op != ReduceOp::kSum && (std::isnan(a) || std::isnan(b))) return a + b;  // NaN
  }
  switch (op) {
    case ReduceOp::kSum:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
      } else {
        return a + b;
      }
    case ReduceOp::kMax:
      return b > a ? b : a;
    case ReduceOp::kMin:
      return b < a ? b : a;
  }
  QMESH_THROW("invalid ReduceOp value ", static_cast<int>(op));
}

template <class T>
void reduce_typed(T* acc, const T* in, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) acc[i] = combine(acc[i], in[i], op);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_16bit(uint16_t* acc, const uint16_t* in, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) acc[i] = FromFloat(combine(ToFloat(acc[i]), ToFloat(in[i]), op));
}

}  // namespace

void reduce_into(void* acc, const void* in, int64_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32:
      return reduce_typed(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    case DType::kFloat64:
      return reduce_typed(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
    case DType::kInt32:
      return reduce_typed(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n, op);
    case DType::kBFloat16:
      return reduce_16bit<bf16_to_float, float_to_bf16>(static_cast<uint16_t*>(acc),
                                                        static_cast<const uint16_t*>(in), n, op);
    case DType::kFloat16:
      return reduce_16bit<fp16_to_float, float_to_fp16>(static_cast<uint16_t*>(acc),
                                                        static_cast<const uint16_t*>(in), n, op);
    default:
      QMESH_THROW_KIND(ErrorKind::kUnsupported, "reduction of dtype ", dtype_name(dtype),
                       " is not supported (fp32, fp64, bf16, fp16, int32)");
  }
}

}  // namespace qmesh::algorithms
