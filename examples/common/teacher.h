// The synthetic regression task of the training examples (train_mlp, c_trainer, through
// teacher_c.h; not part of the library): targets t =
// tanh(x·Aᵀ)·Bᵀ of a fixed random "teacher" network, inputs x ~ N(0, 1). Sample i of step s is a
// pure function of (seed, s, i), so every data-parallel rank draws different samples, every tp
// layout sees the same ones, and a resumed run continues on exactly the data it would have seen.
#pragma once

#include <cstdint>

#include "qmesh/tensor.h"

namespace examples {

class TeacherTask {
 public:
  TeacherTask(int64_t hidden, uint64_t seed);

  int64_t hidden() const { return hidden_; }

  // Fills x and t ([tokens, hidden] fp32 host) with tokens [first, first + tokens) of step
  // `step` (a token is one sample; the global token index orders dp ranks then tokens).
  void batch(int64_t step, int64_t first, const qmesh::TensorView& x,
             const qmesh::TensorView& t) const;

  // Mean squared error of predicting each target feature's mean, estimated on 4096
  // held-out tokens: the loss a model must beat to have learned anything.
  double mean_predictor_loss() const;

 private:
  int64_t hidden_;
  uint64_t seed_;
  qmesh::Tensor a_, b_;  // [hidden, hidden]
};

}  // namespace examples
