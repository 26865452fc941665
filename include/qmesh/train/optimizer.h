// Optimizers over fp32 master weights (each rank updates its own shards after the
// data-parallel gradient reduction). Each parameter is updated where it lives: host loops,
// or one CUDA kernel per parameter on the optimizer's stream (asynchronous; the same float
// operations, so host and CUDA agree to a few ulp). The update is element-wise and
// deterministic, so a resumed run continues bit for bit. The moment buffers live on their
// parameter's device; the step counter on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/stream.h"

namespace qmesh {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;      // 0 disables the momentum buffer
  float weight_decay = 0.0f;  // decoupled: w -= lr * wd * w
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // decoupled (Loshchilov & Hutter)
};

// One optimizer over a fixed list of parameters (their order defines the state layout).
class QMESH_API Optimizer {
 public:
  virtual ~Optimizer();
  // Applies one update from each parameter's grad.
  virtual void step() = 0;
  // Number of steps taken (restored by load_state).
  virtual int64_t steps() const = 0;
  // The learning rate of the next step() and on (a schedule sets it before each step; it is
  // not part of the state). Error unless lr > 0.
  virtual float lr() const = 0;
  virtual void set_lr(float lr) = 0;
  // The state tensors (moment buffers and a 1-element step counter), named
  // "<param>.<slot>", for checkpoints. Loading writes into these same tensors.
  virtual std::vector<std::pair<std::string, Tensor*>> state() = 0;
};

// Error if a parameter is not fp32, its grad differs in dtype, device or shape, or its device
// is unusable. `stream` orders the updates of CUDA parameters (ignored for host ones).
QMESH_API std::unique_ptr<Optimizer> make_sgd(std::vector<Parameter*> params, SgdOptions options,
                                              Stream stream = {});
QMESH_API std::unique_ptr<Optimizer> make_adamw(std::vector<Parameter*> params,
                                                AdamWOptions options, Stream stream = {});

}  // namespace qmesh
