#include "qmesh/train/loss.h"

#include <string>
#include <vector>

#include "cuda/loss_kernel.h"
#include "qmesh/copy.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/device.h"
#include "qmesh/error.h"

namespace qmesh {

void mse_loss(const TensorView& y, const TensorView& target, double global_count,
              const TensorView& dy, const TensorView& sum_sq, Stream stream) {
  check_not_empty(y, "mse_loss output");
  check_dtype(y, DType::kFloat32, "mse_loss output");
  const auto check_like_y = [&](const TensorView& t, const char* what) {
    check_dtype(t, DType::kFloat32, what);
    check_shape(t, y.shape, what);
    check_device(t, y.device, what);
  };
  check_like_y(target, "mse_loss target");
  check_like_y(dy, "mse_loss dy");
  check_dtype(sum_sq, DType::kFloat64, "mse_loss sum_sq");
  check_shape(sum_sq, Shape{1}, "mse_loss sum_sq");
  check_device(sum_sq, y.device, "mse_loss sum_sq");
  const int64_t n = y.numel();
  QMESH_CHECK(global_count >= double(n), "mse_loss: global_count (", global_count,
              ") must count at least the ", n, " local elements");
  const float* py = y.data_as<float>();
  const float* pt = target.data_as<float>();
  float* pd = dy.data_as<float>();
  double* out = sum_sq.data_as<double>();
  detail::dispatch(
      y.device,
      [&] {
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double d = double(py[i]) - double(pt[i]);
          sum += d * d;
          pd[i] = float(2.0 * d / global_count);
        }
        *out = sum;
      },
      [&](auto device) {
        detail::cuda::mse_loss(device, py, pt, global_count, pd, out, n, stream);
      });
}

double mse_loss(const Mesh& mesh, LossOutputs outputs, const TensorView& y,
                const TensorView& target, const TensorView& dy, Stream stream) {
  const MeshResource& roles = mesh.resource();
  std::vector<std::string> distinct;  // the axes over which ranks hold distinct elements
  for (const std::string& role :
       {roles.dp, roles.fsdp, outputs == LossOutputs::kSplitOverTp ? roles.tp : std::string()})
    for (const MeshAxis& axis : mesh.axes())
      if (!role.empty() && axis.name == role) distinct.push_back(role);
  const std::shared_ptr<Communicator> group =
      distinct.empty() ? mesh.role("") : mesh.group(distinct);
  const double global_count = double(y.numel()) * group->size();
  Tensor sum(DType::kFloat64, Shape{1}, y.device);
  mse_loss(y, target, global_count, dy, sum, stream);
  group->all_reduce(sum, ReduceOp::kSum, stream);
  synchronize(y.device, stream);
  return *clone(sum, Device::host()).data_as<double>() / global_count;
}

}  // namespace qmesh
