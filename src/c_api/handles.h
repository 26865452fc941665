// What the C API's opaque handles hold.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/optimizer.h"

// Members are destroyed in reverse order: `keep_alive` (what the transport needs, e.g. the
// MPI session) outlives the communicators.
struct qmesh_world {
  std::shared_ptr<void> keep_alive;
  std::shared_ptr<qmesh::Communicator> comm;
};

struct qmesh_mesh {
  std::shared_ptr<void> keep_alive;
  std::unique_ptr<qmesh::Mesh> mesh;
};

struct qmesh_context {
  std::unique_ptr<qmesh::LayerContext> context;
};

// A layer and its parameters (taken once, in the layer's order).
template <class Layer>
struct QmeshLayerHandle {
  std::unique_ptr<Layer> layer;
  std::vector<qmesh::Parameter*> params;
};

struct qmesh_layernorm_mlp : QmeshLayerHandle<qmesh::LayerNormMLP> {};
struct qmesh_dense : QmeshLayerHandle<qmesh::Dense> {};

struct qmesh_grad_sync {
  std::unique_ptr<qmesh::GradSync> sync;
};

struct qmesh_optimizer {
  std::unique_ptr<qmesh::Optimizer> optimizer;
  // Its state() (names and tensors), taken once: the names qmesh_optimizer_state hands out.
  std::vector<std::pair<std::string, qmesh::Tensor*>> state;
};

namespace qmesh::capi {

// qmesh_parameter is qmesh::Parameter seen from C.
inline Parameter* param(qmesh_parameter* p) { return reinterpret_cast<Parameter*>(p); }
inline const Parameter* param(const qmesh_parameter* p) {
  return reinterpret_cast<const Parameter*>(p);
}
inline qmesh_parameter* handle(Parameter* p) { return reinterpret_cast<qmesh_parameter*>(p); }

// The parameters of a C array (Error for a null array or element).
std::vector<Parameter*> param_list(qmesh_parameter* const* params, int n);

}  // namespace qmesh::capi
