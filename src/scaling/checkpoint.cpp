#include "qmesh/scaling/checkpoint.h"

#include <cstring>
#include <fstream>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "qmesh/tensor_file.h"

namespace qmesh {

namespace {

const std::string kHistory = "scaling.amax_history", kScale = "scaling.scale",
                  kScaleInv = "scaling.scale_inv", kRoles = "scaling.roles",
                  kRecipe = "scaling.recipe";

// Element 0 of each row of `storage` (fp32 [n, k], on any device): the n logical values.
Tensor column0(const TensorView& storage) {
  const int64_t n = storage.shape.dim(0), k = storage.shape.dim(1);
  std::vector<float> rows(size_t(n * k));
  copy_bytes(rows.data(), Device::host(), storage.data, storage.device, storage.nbytes());
  Tensor out(DType::kFloat32, Shape{n});
  for (int64_t i = 0; i < n; ++i) out.data_as<float>()[i] = rows[size_t(i * k)];
  return out;
}

// Writes `values` (fp32 [n] on the host) into element 0 of each row of `storage`, keeping
// the padding.
void set_column0(const TensorView& storage, const Tensor& values) {
  const int64_t n = storage.shape.dim(0), k = storage.shape.dim(1);
  std::vector<float> rows(size_t(n * k));
  copy_bytes(rows.data(), Device::host(), storage.data, storage.device, storage.nbytes());
  for (int64_t i = 0; i < n; ++i) rows[size_t(i * k)] = values.data_as<float>()[i];
  copy_bytes(storage.data, storage.device, rows.data(), Device::host(), storage.nbytes());
}

// The tensor `name` of `file`, which must have `dtype` and `rank` dimensions.
const Tensor& get(const std::map<std::string, Tensor>& file, const std::string& name, DType dtype,
                  int rank, const std::string& path) {
  const auto it = file.find(name);
  QMESH_CHECK(it != file.end(), path, " holds no FP8 delayed-scaling state ('", name,
              "' missing): it was written by a run without delayed scaling, or by a qmesh "
              "version that kept that state in a separate file; resume with the recipe and "
              "version that wrote it, or start the run afresh");
  const Tensor& t = it->second;
  QMESH_CHECK(t.dtype() == dtype && t.shape().rank() == rank, "'", name, "' in ", path, " is ",
              dtype_name(t.dtype()), " ", t.shape().str(), ", expected ", dtype_name(dtype),
              " of rank ", rank, " (a corrupted or foreign file?)");
  return t;
}

}  // namespace

std::map<std::string, Tensor> scaling_tensors(const ScalingStates& states) {
  const int n = states.size();
  std::map<std::string, Tensor> out;
  const TensorView history = states.amax_history();
  Tensor h(DType::kFloat32, history.shape);
  copy_bytes(h.data(), Device::host(), history.data, history.device, history.nbytes());
  out.emplace(kHistory, std::move(h));
  out.emplace(kScale, column0(states.scale()));
  out.emplace(kScaleInv, column0(states.scale_inv()));
  Tensor roles(DType::kInt32, Shape{n});
  for (int i = 0; i < n; ++i) roles.data_as<int32_t>()[i] = int32_t(states.role(i));
  out.emplace(kRoles, std::move(roles));
  const DelayedScaling& r = states.recipe();
  Tensor recipe(DType::kFloat32, Shape{3});
  const float facts[3] = {r.margin, float(r.amax_compute_algo), float(r.fp8_format)};
  std::memcpy(recipe.data(), facts, sizeof(facts));
  out.emplace(kRecipe, std::move(recipe));
  return out;
}

void check_scaling_tensors(const ScalingStates& states, const std::map<std::string, Tensor>& file,
                           const std::string& path) {
  const Tensor& roles = get(file, kRoles, DType::kInt32, 1, path);
  const Tensor& history = get(file, kHistory, DType::kFloat32, 2, path);
  const int64_t n = roles.numel(), len = history.shape().dim(0);
  for (const std::string& name : {kScale, kScaleInv})
    QMESH_CHECK(get(file, name, DType::kFloat32, 1, path).numel() == n, "'", name, "' in ", path,
                " does not hold one value per operand of its '", kRoles,
                "' (a corrupted or foreign file?)");
  QMESH_CHECK(history.shape().dim(1) == n, "'", kHistory, "' in ", path,
              " does not hold one column per operand of its '", kRoles,
              "' (a corrupted or foreign file?)");
  QMESH_CHECK(get(file, kRecipe, DType::kFloat32, 1, path).numel() == 3, "'", kRecipe, "' in ",
              path, " does not hold 3 values (a corrupted or foreign file?)");
  QMESH_CHECK(n == states.size() && len == states.history_len(), "the scaling state in ", path,
              " holds ", n, " operands x history ", len, " but the state has ", states.size(),
              " operands x history ", states.history_len(),
              "; build the ScalingStates with the saved recipe and operands");
  for (int i = 0; i < int(n); ++i) {
    const int32_t saved = roles.data_as<int32_t>()[i];
    QMESH_CHECK(saved == int32_t(states.role(i)), "the scaling state in ", path, ": operand ", i,
                " was saved with role ", saved, " but the state has role ", int(states.role(i)),
                "; the operands must be registered in the same order");
  }
}

void load_scaling_tensors(ScalingStates& states, const std::map<std::string, Tensor>& file,
                          const std::string& path) {
  check_scaling_tensors(states, file, path);
  const float* saved = file.at(kRecipe).data_as<float>();
  const DelayedScaling& r = states.recipe();
  if (saved[0] != r.margin || saved[1] != float(r.amax_compute_algo) ||
      saved[2] != float(r.fp8_format))
    QMESH_LOG_WARN("the scaling state in ", path,
                   " was written with another margin, amax algorithm or FP8 format than the "
                   "current recipe; its histories and scales are loaded as they are");
  const Tensor& history = file.at(kHistory);
  const TensorView dst = states.amax_history();
  copy_bytes(dst.data, dst.device, history.data(), Device::host(), dst.nbytes());
  set_column0(states.scale(), file.at(kScale));
  set_column0(states.scale_inv(), file.at(kScaleInv));
}

void save_scaling_states(const ScalingStates& states, const std::string& path) {
  const std::map<std::string, Tensor> tensors = scaling_tensors(states);
  std::vector<NamedTensor> named;
  for (const auto& [name, t] : tensors) named.push_back({name, t});
  save_tensors(path, named);
}

void load_scaling_states(ScalingStates& states, const std::string& path) {
  std::map<std::string, Tensor> file;
  try {
    file = read_tensors(path);
  } catch (const Error&) {
    char magic[8] = {};
    std::ifstream(path, std::ios::binary).read(magic, sizeof(magic));
    QMESH_CHECK(std::memcmp(magic, "QMSCALE", 8) != 0, path,
                " is a scaling checkpoint of the separate format version 1 (\"QMSCALE\") of "
                "earlier qmesh versions, which this build no longer reads: scaling states are "
                "now named tensors of a tensor file (format version ",
                kTensorFileVersion, "); resume with the qmesh version that wrote it");
    throw;
  }
  load_scaling_tensors(states, file, path);
}

}  // namespace qmesh
