#include "teacher.h"

#include <cmath>
#include <vector>

#include "qmesh/ops/gemm.h"
#include "qmesh/random.h"

namespace train_mlp {

namespace {

qmesh::Tensor random_matrix(int64_t n, uint64_t seed, float stddev) {
  qmesh::Tensor m(qmesh::DType::kFloat32, qmesh::Shape{n, n});
  float* p = m.data_as<float>();
  for (int64_t i = 0; i < n * n; ++i) p[i] = stddev * qmesh::counter_normal(seed, uint64_t(i));
  return m;
}

// out = in · Wᵀ (fp32 GEMM on the host).
void matmul_t(const qmesh::TensorView& in, const qmesh::Tensor& w, const qmesh::TensorView& out) {
  qmesh::GemmArgs args;
  args.a = qmesh::GemmOperand::plain(in);
  args.b = qmesh::GemmOperand::plain(w);
  args.trans_b = qmesh::GemmTranspose::kYes;
  args.d = out;
  qmesh::gemm(args);
}

constexpr uint64_t kDataStream = 0x5EED0DA7Aull;

}  // namespace

TeacherTask::TeacherTask(int64_t hidden, uint64_t seed)
    : hidden_(hidden),
      seed_(seed),
      a_(random_matrix(hidden, seed ^ 0xA11CEull, std::sqrt(2.0f / float(hidden)))),
      b_(random_matrix(hidden, seed ^ 0xB0Bull, 1.6f / std::sqrt(float(hidden)))) {}

void TeacherTask::batch(int64_t step, int64_t first, const qmesh::TensorView& x,
                        const qmesh::TensorView& t) const {
  const int64_t tokens = x.shape.rows();
  float* px = x.data_as<float>();
  const uint64_t stream = qmesh::mix_seed(seed_ ^ kDataStream, uint64_t(step));
  for (int64_t i = 0; i < tokens * hidden_; ++i)
    px[i] = qmesh::counter_normal(stream, uint64_t(first * hidden_ + i));
  qmesh::Tensor z(qmesh::DType::kFloat32, x.shape);
  matmul_t(x, a_, z);
  float* pz = z.data_as<float>();
  for (int64_t i = 0; i < z.numel(); ++i) pz[i] = std::tanh(pz[i]);
  matmul_t(z, b_, t);
}

double TeacherTask::mean_predictor_loss() const {
  const int64_t n = 4096;
  qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{n, hidden_}), t(x.dtype(), x.shape());
  batch(-1, 0, x, t);  // step -1: never used for training
  double loss = 0;
  for (int64_t c = 0; c < hidden_; ++c) {
    double mean = 0, sq = 0;
    for (int64_t r = 0; r < n; ++r) mean += t.data_as<float>()[r * hidden_ + c];
    mean /= double(n);
    for (int64_t r = 0; r < n; ++r) {
      const double d = t.data_as<float>()[r * hidden_ + c] - mean;
      sq += d * d;
    }
    loss += sq / double(n);
  }
  return loss / double(hidden_);
}

}  // namespace train_mlp
