#include "teacher.h"

#include <cmath>
#include <vector>

#include "qmesh/ops/gemm.h"
#include "qmesh/random.h"

namespace examples {

using namespace qmesh;

namespace {

Tensor random_matrix(int64_t n, uint64_t seed, float stddev) {
  Tensor m(DType::kFloat32, Shape{n, n});
  float* p = m.data_as<float>();
  for (int64_t i = 0; i < n * n; ++i) p[i] = stddev * counter_normal(seed, uint64_t(i));
  return m;
}

// out = in · Wᵀ (fp32 GEMM on the host).
void matmul_t(const TensorView& in, const Tensor& w, const TensorView& out) {
  GemmArgs args;
  args.a = GemmOperand::plain(in);
  args.b = GemmOperand::plain(w);
  args.trans_b = GemmTranspose::kYes;
  args.d = out;
  gemm(args);
}

int64_t checked_hidden(int64_t hidden) {
  QMESH_CHECK(hidden > 0, "the teacher's hidden size must be positive, got ", hidden);
  return hidden;
}

constexpr uint64_t kDataStream = 0x5EED0DA7Aull;

}  // namespace

TeacherTask::TeacherTask(int64_t hidden, uint64_t seed)
    : hidden_(checked_hidden(hidden)),
      seed_(seed),
      a_(random_matrix(hidden, seed ^ 0xA11CEull, std::sqrt(2.0f / float(hidden)))),
      b_(random_matrix(hidden, seed ^ 0xB0Bull, 1.6f / std::sqrt(float(hidden)))) {}

void TeacherTask::batch(int64_t step, int64_t first, const TensorView& x,
                        const TensorView& t) const {
  check_dtype(x, DType::kFloat32, "teacher input x");
  check_device(x, Device::host(), "teacher input x");
  QMESH_CHECK(x.shape.rank() == 2 && x.shape.cols() == hidden_, "teacher input x must be [tokens, ",
              hidden_, "], got ", x.shape.str());
  check_dtype(t, DType::kFloat32, "teacher target t");
  check_device(t, Device::host(), "teacher target t");
  check_shape(t, x.shape, "teacher target t");
  const int64_t tokens = x.shape.rows();
  float* px = x.data_as<float>();
  const uint64_t stream = mix_seed(seed_ ^ kDataStream, uint64_t(step));
  for (int64_t i = 0; i < tokens * hidden_; ++i)
    px[i] = counter_normal(stream, uint64_t(first * hidden_ + i));
  Tensor z(DType::kFloat32, x.shape);
  matmul_t(x, a_, z);
  float* pz = z.data_as<float>();
  for (int64_t i = 0; i < z.numel(); ++i) pz[i] = std::tanh(pz[i]);
  matmul_t(z, b_, t);
}

double TeacherTask::mean_predictor_loss() const {
  const int64_t n = 4096;
  Tensor x(DType::kFloat32, Shape{n, hidden_}), t(x.dtype(), x.shape());
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

}  // namespace examples
