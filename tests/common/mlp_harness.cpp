#include "mlp_harness.h"

#include "qmesh/comm/local.h"
#include "qmesh/copy.h"

namespace qmesh::testing_mlp {

namespace {

// A host copy of t (blocking; the work that wrote t must have completed).
Tensor on_host(const TensorView& t) { return clone(t, Device::host()); }

std::vector<double> to_double(const TensorView& t) {
  const Tensor h = on_host(t);
  const float* p = h.data_as<float>();
  return std::vector<double>(p, p + h.numel());
}

Tensor to_tensor(const std::vector<double>& v, Shape shape) {
  Tensor t(DType::kFloat32, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.data_as<float>()[i] = float(v[i]);
  return t;
}

// Copies rows [row0, row0 + rows) of a [*, cols] global array into a tensor.
Tensor rows_of(const std::vector<double>& global, int64_t row0, int64_t rows, int64_t cols) {
  return to_tensor(
      std::vector<double>(global.begin() + row0 * cols, global.begin() + (row0 + rows) * cols),
      Shape{rows, cols});
}

// Gathers equal-size slices from every rank of `comm` (rank-major).
std::vector<double> gather(Communicator& comm, const TensorView& slice) {
  Tensor all(DType::kFloat32, Shape{comm.size(), slice.numel()});
  comm.all_gather(slice, all);
  return to_double(all);
}

}  // namespace

MlpRun run_sharded(const std::shared_ptr<Communicator>& world, const ShardedCase& c) {
  std::vector<MeshAxis> axes{{"dp", c.dp}};
  MeshResource roles;
  if (c.fsdp > 1) {
    axes.push_back({"fsdp", c.fsdp});
    roles.fsdp = "fsdp";
  }
  axes.push_back({"tp", c.tp});
  Mesh mesh(world, axes, roles);
  LayerContext ctx(mesh, c.recipe,
                   {.placement = c.placement,
                    .overlap = c.overlap,
                    .fsdp = c.fsdp_options,
                    .activation_dtype = c.activation_dtype});
  LayerNormMLP block("mlp", c.hidden, c.ffn,
                     {c.sequence_parallel, 1e-5f, std::nullopt, c.gathered_input}, ctx, c.seed);
  const FsdpGroup& fsdp = ctx.fsdp();
  const int data = fsdp.data_size(), data_rank = fsdp.data_rank(), tp_rank = mesh.coord("tp");
  const int64_t T = c.tokens_per_dp, H = c.hidden, F = c.ffn;
  const int64_t local_tokens = c.sequence_parallel ? T / c.tp : T;
  const int64_t row0 = data_rank * T + (c.sequence_parallel ? tp_rank * local_tokens : 0);
  TensorView y, dx;
  Tensor x, dy;  // must outlive backward
  for (int step = 0; step < c.steps; ++step) {
    const auto gx = sample(c.seed + 1, step, data * T * H);
    const auto gdy = sample(c.seed + 2, step, data * T * H);
    x = clone(rows_of(gx, row0, local_tokens, H), c.placement.device);
    dy = clone(rows_of(gdy, row0, local_tokens, H), c.placement.device);
    y = block.forward(x);
    dx = block.backward(dy);
    ctx.end_step();
  }
  synchronize(c.placement.device, c.placement.stream);
  // Outputs: gather every rank's slice, keep tp rank 0's copy when tp ranks hold the same.
  MlpRun r;
  const auto ys = gather(*world, on_host(y)), dxs = gather(*world, on_host(dx));
  r.y.resize(size_t(data * T * H));
  r.dx.resize(r.y.size());
  for (int rank = 0; rank < world->size(); ++rank) {
    const int d = rank / c.tp, t = rank % c.tp;
    if (!c.sequence_parallel && t != 0) continue;
    const int64_t start = (d * T + (c.sequence_parallel ? t * local_tokens : 0)) * H;
    const int64_t n = local_tokens * H;
    std::copy_n(ys.begin() + rank * n, n, r.y.begin() + start);
    std::copy_n(dxs.begin() + rank * n, n, r.dx.begin() + start);
  }
  // Gradients: summed over the data ranks (an fsdp shard already is: gather the shards and
  // drop the padding), then the tp shards assembled into the global layouts.
  const auto tp = mesh.axis("tp");
  std::vector<Tensor> grads;  // ln.gamma, ln.beta, fc1.w, fc1.b, fc2.w, fc2.b on the host
  for (Parameter* p : block.parameters()) {
    Tensor local = on_host(p->grad);
    if (!p->fsdp_sharded()) {
      grads.push_back(std::move(local));
      fsdp.data_group()->all_reduce(grads.back(), ReduceOp::kSum);
      continue;
    }
    Tensor full(DType::kFloat32, Shape{local.numel() * fsdp.size()});
    fsdp.all_gather(local, full);
    grads.push_back(
        clone(TensorView(full.data(), DType::kFloat32, Shape{p->fsdp_numel}), Device::host()));
  }
  r.grads.gamma = to_double(grads[0]);
  r.grads.beta = to_double(grads[1]);
  r.grads.w1 = gather(*tp, grads[2]);  // row shards: concatenation is the layout
  r.grads.b1 = gather(*tp, grads[3]);
  const auto w2_shards = gather(*tp, grads[4]);  // [tp][H][F/tp]
  const int64_t fl = F / c.tp;
  r.grads.w2.resize(size_t(H * F));
  for (int t = 0; t < c.tp; ++t)
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < fl; ++j)
        r.grads.w2[i * F + t * fl + j] = w2_shards[(t * H + i) * fl + j];
  r.grads.b2 = to_double(grads[5]);
  return r;
}

MlpParams initial_params(const ShardedCase& c) {
  MlpParams p;
  run_local_ranks(1, [&](Communicator& comm) {
    const std::shared_ptr<Communicator> world(&comm, [](Communicator*) {});
    Mesh mesh(world, {{"dp", 1}, {"tp", 1}});
    LayerContext ctx(mesh, Recipe::kFp32);
    LayerNormMLP block("mlp", c.hidden, c.ffn, {}, ctx, c.seed);
    const auto params = block.parameters();
    p = {to_double(params[0]->value), to_double(params[1]->value), to_double(params[2]->value),
         to_double(params[3]->value), to_double(params[4]->value), to_double(params[5]->value)};
  });
  return p;
}

}  // namespace qmesh::testing_mlp
