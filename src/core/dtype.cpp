#include "qmesh/dtype.h"

#include "qmesh/error.h"

namespace qmesh {

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "fp32", 4},       {DType::kFloat16, "fp16", 2},
    {DType::kBFloat16, "bf16", 2},      {DType::kFloat8E4M3, "fp8e4m3", 1},
    {DType::kFloat8E5M2, "fp8e5m2", 1}, {DType::kInt32, "int32", 4},
    {DType::kFloat64, "fp64", 8},       {DType::kFloat4E2M1x2, "fp4e2m1x2", 1},
    {DType::kFloat8E8M0, "fp8e8m0", 1},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  QMESH_THROW(
      "unknown dtype value ", static_cast<int>(dtype),
      " (expected one of fp32, fp16, bf16, fp8e4m3, fp8e5m2, int32, fp64, fp4e2m1x2, fp8e8m0)");
}
}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }

DType parse_dtype(std::string_view name) {
  for (const auto& entry : kDTypes)
    if (entry.name == name) return entry.dtype;
  if (name == "e4m3") return DType::kFloat8E4M3;
  if (name == "e5m2") return DType::kFloat8E5M2;
  QMESH_THROW(
      "unknown dtype '", name,
      "' (expected one of fp32, fp16, bf16, fp8e4m3, fp8e5m2, int32, fp64, fp4e2m1x2, fp8e8m0)");
}

bool is_fp8(DType dtype) { return dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2; }

bool is_wide_float(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

}  // namespace qmesh
