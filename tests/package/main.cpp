// A minimal qmesh trainer: one LayerNormMLP block, data x tensor parallel over MPI, FP8
// delayed scaling, AdamW, a checkpoint every 10 steps and a resume from the latest.
// Built against the installed package (tests/package/CMakeLists.txt); run with
//   mpirun -np 4 ./trainer <checkpoint dir>      (dp 2 x tp 2; any even rank count)
#include <qmesh/comm/mpi.h>
#include <qmesh/error.h>
#include <qmesh/layers/layer_norm_mlp.h>
#include <qmesh/train/checkpoint.h>
#include <qmesh/train/grad_sync.h>
#include <qmesh/train/loss.h>
#include <qmesh/train/optimizer.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "teacher.h"  // examples/common: the examples' synthetic task, not the library

int train(int argc, char** argv) {
  qmesh::MpiSession mpi(&argc, &argv);
  const auto world = qmesh::make_mpi_world();
  const int tp = 2, dp = world->size() / tp;
  const int64_t hidden = 64, ffn = 256, tokens = 32;  // tokens per data-parallel rank
  qmesh::LayerContext ctx(qmesh::Mesh(world, {{"dp", dp}, {"tp", tp}}), qmesh::Recipe::kFp8Delayed,
                          {.delayed = {.amax_history_len = 16}});
  qmesh::LayerNormMLP block("block0", hidden, ffn, {}, ctx, /*seed=*/1);
  const std::vector<qmesh::Parameter*> params = block.parameters();
  const auto adamw = qmesh::make_adamw(params, {.lr = 3e-3f, .weight_decay = 0.0f});
  qmesh::GradSync sync(ctx.mesh().axis("dp"), params);   // sums the gradients over dp
  const examples::TeacherTask task(hidden, /*seed=*/7);  // synthetic data: y = teacher(x)
  // The parameters, AdamW's moments and the FP8 scaling state, in one checkpoint.
  const qmesh::CheckpointContent checkpoint = qmesh::training_checkpoint(ctx, params, *adamw);
  const std::string dir = argc > 1 ? argv[1] : "checkpoints";
  int step = 0;  // collective: every rank loads, or every rank throws the same error
  if (std::filesystem::exists(dir + "/latest"))
    step = qmesh::load_checkpoint(dir, checkpoint, *world);
  qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{tokens, hidden}), t(x.dtype(), x.shape()),
      dy(x.dtype(), x.shape());
  double loss = 0;
  for (const int last = step + 30; step < last;) {
    ++step;
    task.batch(step, ctx.mesh().coord("dp") * tokens, x, t);  // this dp rank's slice
    const qmesh::TensorView y = block.forward(x);
    loss = qmesh::mse_loss(ctx.mesh(), qmesh::LossOutputs::kReplicatedOverTp, y, t, dy);
    block.backward(dy);
    sync.ready(params);  // after each layer's backward: its gradients are final
    sync.finish();
    ctx.end_step();  // the step's one amax all-reduce and FP8 scale update
    adamw->set_lr(3e-3f * (step < 40 ? 1.0f : 0.5f));  // a schedule
    adamw->step();
    if (step % 10 == 0) qmesh::save_checkpoint(dir, step, checkpoint, *world);
    if (world->rank() == 0 && step % 10 == 0) std::printf("step %d loss %.6f\n", step, loss);
  }
  const double baseline = task.mean_predictor_loss();
  if (world->rank() == 0) std::printf("loss %.6f, predicting the mean %.6f\n", loss, baseline);
  return loss < baseline ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return train(argc, argv);
  } catch (const qmesh::Error& e) {  // the same message on every rank for collective errors
    std::fprintf(stderr, "trainer: %s\n", e.message().c_str());
    std::_Exit(1);  // not MPI_Finalize, which would wait for ranks that did not fail
  }
}
