/* A C11 program that uses qmesh only through its installed C API, as a trainer in another
 * language would: built once with pkg-config and once with find_package(qmesh), run under
 * mpirun. Checks the header and library versions agree, builds a mesh over the ranks, runs
 * one LayerNormMLP forward and backward, and checks an all-reduce against its known sum. */
#include <stdio.h>
#include <stdlib.h>

#include "qmesh/c_api.h"

#define CHECK(call)                                                                           \
  do {                                                                                        \
    const qmesh_status status_ = (call);                                                      \
    if (status_ != QMESH_OK) {                                                                \
      fprintf(stderr, "%s: %s: %s\n", #call, qmesh_status_name(status_), qmesh_last_error()); \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

int main(int argc, char** argv) {
  if (qmesh_version() != QMESH_C_API_VERSION) {
    fprintf(stderr, "header %d, library %d\n", QMESH_C_API_VERSION, qmesh_version());
    return 1;
  }
  qmesh_world* world = NULL;
  CHECK(qmesh_world_create_mpi(&argc, &argv, &world));
  int rank = 0, size = 0;
  CHECK(qmesh_world_rank(world, &rank));
  CHECK(qmesh_world_size(world, &size));
  const qmesh_mesh_axis axes[1] = {{"tp", size}};
  qmesh_mesh* mesh = NULL;
  CHECK(qmesh_mesh_create(world, axes, 1, NULL, &mesh));
  qmesh_context_config cc;
  qmesh_context_config_init(&cc);
  cc.recipe = QMESH_RECIPE_FP8_CURRENT;
  qmesh_context* ctx = NULL;
  CHECK(qmesh_context_create(mesh, &cc, &ctx));
  qmesh_layernorm_mlp_config bc;
  qmesh_layernorm_mlp_config_init(&bc);
  bc.hidden = 16;
  bc.ffn = 16 * size;
  bc.seed = 7;
  qmesh_layernorm_mlp* block = NULL;
  CHECK(qmesh_layernorm_mlp_create(ctx, "block", &bc, &block));
  float x[4 * 16];
  for (int i = 0; i < 4 * 16; ++i) x[i] = (float)(i % 7) - 3.0f;
  const int64_t shape[2] = {4, 16};
  const qmesh_tensor xt = qmesh_host_tensor(x, QMESH_FLOAT32, 2, shape);
  qmesh_tensor y, dx;
  CHECK(qmesh_layernorm_mlp_forward(block, &xt, &y));
  CHECK(qmesh_layernorm_mlp_backward(block, &y, &dx));
  double v = rank + 1;
  const int64_t one = 1;
  const qmesh_tensor vt = qmesh_host_tensor(&v, QMESH_FLOAT64, 1, &one);
  CHECK(qmesh_world_all_reduce(world, &vt, QMESH_SUM));
  if (v != size * (size + 1) / 2.0) {
    fprintf(stderr, "all-reduce gave %f\n", v);
    return 1;
  }
  if (rank == 0) printf("qmesh C consumer: %s, %d ranks: ok\n", qmesh_build_info(), size);
  CHECK(qmesh_layernorm_mlp_destroy(block));
  CHECK(qmesh_context_destroy(ctx));
  CHECK(qmesh_mesh_destroy(mesh));
  CHECK(qmesh_world_destroy(world));
  return 0;
}
