// Element types that qmesh tensors and collectives carry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "qmesh/export.h"

namespace qmesh {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat8E4M3 = 3,  // OCP float8_e4m3fn: no inf, max 448, NaN = S.1111.111
  kFloat8E5M2 = 4,  // OCP float8_e5m2: IEEE-like, max 57344
  kInt32 = 5,
  kFloat64 = 6,
  kFloat4E2M1x2 = 7,  // two OCP float4_e2m1fn codes per byte: element 2k low nibble, 2k+1 high
  kFloat8E8M0 = 8,    // OCP E8M0 scale (MX formats): 2^(byte - 127), 0xFF = NaN; no arithmetic
};

// Bytes per element. Throws qmesh::Error for a value outside the enum.
QMESH_API size_t dtype_size(DType dtype);
// Canonical lower-case name: "fp32", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int32", "fp64",
// "fp4e2m1x2", "fp8e8m0".
QMESH_API std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; also accepts "e4m3"/"e5m2". Unknown names are an Error listing the
// accepted ones.
QMESH_API DType parse_dtype(std::string_view name);
// True for the two FP8 element formats (E4M3, E5M2; not the E8M0 scale format).
QMESH_API bool is_fp8(DType dtype);
// True for fp32/fp16/bf16/fp64: dtypes that a higher-precision op input may have.
QMESH_API bool is_wide_float(DType dtype);

// The C++ type that stores one element of a dtype.
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};

}  // namespace qmesh
