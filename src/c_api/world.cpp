// The C API's world (the processes of the job) and mesh (named axes over it).
#include <mutex>
#include <string>
#include <vector>

#include "boundary.h"
#include "handles.h"
#include "qmesh/config.h"
#include "tensor_view.h"
#if QMESH_WITH_MPI
#include "qmesh/comm/mpi.h"
#endif
#if QMESH_WITH_UCX
#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/ucx.h"
#endif

namespace qmesh::capi {
namespace {

#if QMESH_WITH_MPI
// One MPI session per process, shared by the MPI worlds: the last one destroyed finalizes
// MPI (if the session initialized it).
std::shared_ptr<MpiSession> mpi_session(int* argc, char*** argv) {
  static std::mutex mutex;
  static std::weak_ptr<MpiSession> current;
  const std::lock_guard lock(mutex);
  std::shared_ptr<MpiSession> session = current.lock();
  if (!session) {
    session = std::make_shared<MpiSession>(argc, argv);
    current = session;
  }
  return session;
}
#endif

ReduceOp reduce_op(const qmesh_reduce_op& op) {  // by reference: no enum load
  return static_cast<ReduceOp>(checked_enum(op, QMESH_SUM, QMESH_MIN, "op"));
}

std::string str(const char* s, const char* what) { return require(s, what); }

}  // namespace
}  // namespace qmesh::capi

using namespace qmesh::capi;

extern "C" {

qmesh_status qmesh_world_create_mpi(int* argc, char*** argv, qmesh_world** world) {
  return guard(__func__, [&] {
    require(world, "world");
#if QMESH_WITH_MPI
    auto session = mpi_session(argc, argv);
    auto out = std::make_unique<qmesh_world>();
    out->keep_alive = session;
    out->comm = qmesh::make_mpi_world();
    *world = out.release();
#else
    (void)argc;
    (void)argv;
    QMESH_THROW_KIND(qmesh::ErrorKind::kUnsupported,
                     "this qmesh was built without MPI (QMESH_WITH_MPI=OFF)");
#endif
  });
}

qmesh_status qmesh_world_create_store(int rank, int size, const char* directory,
                                      qmesh_world** world) {
  return guard(__func__, [&] {
    require(world, "world");
    const std::string dir = str(directory, "directory");
    if (size <= 0 || rank < 0 || rank >= size)
      QMESH_THROW("rank " + std::to_string(rank) + " of size " + std::to_string(size) +
                  ": need size >= 1 and 0 <= rank < size");
#if QMESH_WITH_UCX
    qmesh::StoreBootstrap bootstrap(std::make_shared<qmesh::FileStore>(dir), rank, size);
    auto out = std::make_unique<qmesh_world>();
    out->comm = qmesh::make_ucx_world(bootstrap);
    *world = out.release();
#else
    QMESH_THROW_KIND(qmesh::ErrorKind::kUnsupported,
                     "a store-bootstrapped world needs UCX; this qmesh was built without it "
                     "(QMESH_WITH_UCX=OFF)");
#endif
  });
}

qmesh_status qmesh_world_destroy(qmesh_world* world) {
  return guard(__func__, [&] { delete world; });
}

qmesh_status qmesh_world_rank(const qmesh_world* world, int* rank) {
  return guard(__func__, [&] { *require(rank, "rank") = require(world, "world")->comm->rank(); });
}

qmesh_status qmesh_world_size(const qmesh_world* world, int* size) {
  return guard(__func__, [&] { *require(size, "size") = require(world, "world")->comm->size(); });
}

qmesh_status qmesh_world_all_reduce(qmesh_world* world, const qmesh_tensor* tensor,
                                    qmesh_reduce_op op) {
  return guard(__func__, [&] {
    require(world, "world")->comm->all_reduce(to_view(tensor, "tensor"), reduce_op(op));
  });
}

qmesh_status qmesh_world_all_gather(qmesh_world* world, const qmesh_tensor* in,
                                    const qmesh_tensor* out) {
  return guard(__func__, [&] {
    require(world, "world")->comm->all_gather(to_view(in, "in"), to_view(out, "out"));
  });
}

qmesh_status qmesh_world_barrier(qmesh_world* world) {
  return guard(__func__, [&] { require(world, "world")->comm->barrier(); });
}

void qmesh_mesh_resource_init(qmesh_mesh_resource* resource) {
  if (resource == nullptr) return;
  *resource = qmesh_mesh_resource{};
  resource->struct_size = sizeof(qmesh_mesh_resource);
  resource->dp = "dp";
  resource->tp = "tp";
}

qmesh_status qmesh_mesh_create(qmesh_world* world, const qmesh_mesh_axis* axes, int naxes,
                               const qmesh_mesh_resource* resource, qmesh_mesh** mesh) {
  return guard(__func__, [&] {
    require(world, "world");
    require(mesh, "mesh");
    require_array(axes, naxes, "axes");
    std::vector<qmesh::MeshAxis> list;
    for (int i = 0; i < naxes; ++i)
      list.push_back({str(axes[i].name, "an axis name"), axes[i].size});
    qmesh::MeshResource roles;
    if (resource != nullptr) {
      qmesh_mesh_resource defaults;
      qmesh_mesh_resource_init(&defaults);
      const qmesh_mesh_resource r =
          read_config(resource, defaults, sizeof(qmesh_mesh_resource), "qmesh_mesh_resource");
      auto name = [](const char* s) { return s ? std::string(s) : std::string(); };
      roles = {name(r.dp), name(r.tp), name(r.fsdp), name(r.pp)};
    }
    auto out = std::make_unique<qmesh_mesh>();
    out->keep_alive = world->keep_alive;
    out->mesh = std::make_unique<qmesh::Mesh>(world->comm, std::move(list), std::move(roles));
    *mesh = out.release();
  });
}

qmesh_status qmesh_mesh_destroy(qmesh_mesh* mesh) {
  return guard(__func__, [&] { delete mesh; });
}

qmesh_status qmesh_mesh_coord(const qmesh_mesh* mesh, const char* axis, int* coord) {
  return guard(__func__, [&] {
    require(coord, "coord");
    *coord = require(mesh, "mesh")->mesh->coord(str(axis, "axis"));
  });
}

qmesh_status qmesh_mesh_all_reduce(qmesh_mesh* mesh, const char* const* axes, int naxes,
                                   const qmesh_tensor* tensor, qmesh_reduce_op op) {
  return guard(__func__, [&] {
    require(mesh, "mesh");
    require_array(axes, naxes, "axes");
    std::vector<std::string> names;
    for (int i = 0; i < naxes; ++i) names.push_back(str(axes[i], "an axis name"));
    mesh->mesh->group(names)->all_reduce(to_view(tensor, "tensor"), reduce_op(op));
  });
}

}  // extern "C"
