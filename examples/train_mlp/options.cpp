#include "options.h"

#include <boost/program_options.hpp>
#include <iostream>

#include "qmesh/config.h"
#include "qmesh/device.h"
#include "qmesh/error.h"
#include "qmesh/ops/gemm_emulation.h"

namespace train_mlp {

namespace po = boost::program_options;

std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  std::string recipe = "delayed";
  std::string overlap = "none";
  std::string device = "auto";
  po::options_description desc(
      "train_mlp: train a stack of LayerNormMLP blocks with data and tensor parallelism and\n"
      "FP8 on a synthetic teacher task. Run under mpirun (or launch/qmeshrun), one process\n"
      "per rank; dp x fsdp x tp must equal the number of ranks.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("dp", po::value(&o.dp)->default_value(o.dp), "data-parallel size (0: ranks / (fsdp x tp))")
    ("fsdp", po::value(&o.fsdp)->default_value(o.fsdp),
     "fully sharded data-parallel size: parameters, gradients and optimizer state sharded over "
     "fsdp ranks, weights all-gathered (FP8 codes under an FP8 recipe) before use")
    ("fsdp-prefetch", po::value(&o.fsdp_prefetch)->default_value(o.fsdp_prefetch),
     "with --fsdp: how many following layers' weight all-gathers run while a layer computes "
     "(0: none)")
    ("rank-order", po::bool_switch(&o.rank_order),
     "--device cpu: sum gradients over the data-parallel ranks in rank order (blocking), so "
     "that every dp x fsdp split of the same data-parallel size trains to the same bits")
    ("tp", po::value(&o.tp)->default_value(o.tp), "tensor-parallel size")
    ("layers", po::value(&o.layers)->default_value(o.layers), "number of LayerNormMLP blocks")
    ("hidden", po::value(&o.hidden)->default_value(o.hidden), "hidden size (divisible by tp)")
    ("ffn", po::value(&o.ffn)->default_value(o.ffn), "MLP inner size (divisible by tp)")
    ("seq", po::value(&o.seq)->default_value(o.seq), "tokens per sequence")
    ("batch", po::value(&o.batch)->default_value(o.batch),
     "sequences per data-parallel rank and step")
    ("steps", po::value(&o.steps)->default_value(o.steps), "training steps (total, counting "
     "the steps of a resumed checkpoint)")
    ("lr", po::value(&o.lr)->default_value(o.lr), "learning rate")
    ("optimizer", po::value(&o.optimizer)->default_value(o.optimizer), "adamw or sgd")
    ("recipe", po::value(&recipe)->default_value(recipe),
     "GEMM precision: bf16, delayed (FP8 delayed scaling), current (FP8 current scaling), "
     "block (FP8 block scaling: 1x128 blocks of activations and gradients, 128x128 tiles of "
     "weights; --ffn / --tp a multiple of 128 when --tp > 1; --overlap none only; no "
     "--fp8-stats), mxfp8 (MXFP8: an E8M0 scale per 32 elements along K; sizes multiples of "
     "32; needs --emulate on devices without native MXFP8 GEMMs, i.e. all today), nvfp4 (NVFP4: "
     "E2M1 codes, an E4M3 scale per 16 elements and 16x16 weight tiles, stochastic rounding of "
     "gradients, the random Hadamard transform on wgrad operands; sizes multiples of 16; needs "
     "--emulate like mxfp8; no --sequence-parallel), fp32")
    ("emulate", po::bool_switch(&o.emulate),
     "--recipe mxfp8 or nvfp4: run its GEMMs emulated (operands dequantized, then a GEMM with "
     "fp32 accumulation; MXFP8BlockScaling::emulate, NVFP4BlockScaling::emulate), like "
     "QMESH_BLOCK_EMULATION=1")
    ("amax-history", po::value(&o.amax_history)->default_value(o.amax_history),
     "delayed scaling: amax history length")
    ("margin", po::value(&o.margin)->default_value(o.margin), "delayed scaling: margin")
    ("sequence-parallel", po::bool_switch(&o.sequence_parallel),
     "shard activations on the token dimension over tp")
    ("overlap", po::value(&overlap)->default_value(overlap),
     "collective-GEMM schedule with --sequence-parallel: none, ring (all-gather/reduce-scatter "
     "hidden behind the GEMMs in tp steps) or bidir (chunks travel both ways)")
    ("device", po::value(&device)->default_value(device),
     "where the layers run: cpu, cuda (one GPU per rank: local rank modulo the GPUs of the "
     "node, NCCL between ranks) or auto (cuda when a GPU is visible)")
    ("regather-input", po::bool_switch(&o.regather_input),
     "with --sequence-parallel: keep only this rank's chunk of each fc1 input and all-gather "
     "it again in backward, alongside the dgrad GEMM (saves the gathered activations; same "
     "result)")
    ("seed", po::value(&o.seed)->default_value(o.seed), "seed of weights, teacher and data")
    ("fp8-stats", po::bool_switch(&o.fp8_stats),
     "FP8 recipes on the CPU: at the end, print for each quantized GEMM operand of rank 0 the "
     "relative RMS error vs fp32, the fractions of values saturated and flushed to zero, and "
     "how stale its scale was (docs/fp8-loss.md)")
    ("log-every", po::value(&o.log_every)->default_value(o.log_every),
     "print a progress line every N steps")
    ("timing", po::bool_switch(&o.timing),
     "print the mean step time split into compute, exposed communication (time blocked "
     "waiting for collectives) and idle (waiting for slower ranks); CPU backend")
    ("checkpoint-dir", po::value(&o.checkpoint_dir), "directory for checkpoints")
    ("checkpoint-every", po::value(&o.checkpoint_every)->default_value(o.checkpoint_every),
     "save a checkpoint every N steps (0: only at the end, when --checkpoint-dir is set)")
    ("resume", po::bool_switch(&o.resume), "continue from the latest checkpoint in "
     "--checkpoint-dir")
    ("csv", po::value(&o.csv), "write the loss curve (step,loss) to this CSV file")
    ("plot", po::value(&o.plot), "draw the loss curve of --csv (and of every --compare CSV) "
     "into this PNG with gnuplot")
    ("compare", po::value(&o.compare)->multitoken(), "other runs' CSV files to plot");
  // clang-format on
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return std::nullopt;
  }
  po::notify(vm);
  o.recipe = qmesh::parse_recipe(recipe);
  o.overlap = qmesh::parse_overlap(overlap);
  QMESH_CHECK(device == "auto" || device == "cpu" || device == "cuda",
              "--device must be auto, cpu or cuda, got '", device, "'");
  o.device = device == "cuda"  ? DeviceChoice::kCuda
             : device == "cpu" ? DeviceChoice::kCpu
                               : DeviceChoice::kAuto;
  return o;
}

namespace {

// Why the layers cannot run on CUDA with these options here; empty when they can.
std::string cuda_obstacle(const Options& o, int ranks_per_node) {
  if (o.timing) return "--timing times the CPU backend's communication waits";
  const int gpus = qmesh::cuda_device_count();
  if (gpus == 0)
    return "this process sees no CUDA device (no GPU, no driver, or a build without CUDA)";
  if (!QMESH_WITH_NCCL) return "qmesh was built without NCCL (QMESH_WITH_NCCL=OFF)";
  if (ranks_per_node > gpus)
    return qmesh::detail::concat(ranks_per_node, " ranks share a node's ", gpus,
                                 " GPU(s), and NCCL needs one GPU per rank; start at most ", gpus,
                                 " ranks per node");
  // Under sequence parallelism every GEMM of the rings multiplies one rank's chunk of tokens.
  const int64_t tokens = o.sequence_parallel ? o.seq * o.batch / o.tp : o.seq * o.batch;
  const bool fp8 = o.recipe != qmesh::Recipe::kFp32 && o.recipe != qmesh::Recipe::kBf16;
  if (fp8 && (o.hidden % 16 != 0 || (o.ffn / o.tp) % 16 != 0 || tokens % 16 != 0))
    return qmesh::detail::concat(
        "FP8 GEMMs on CUDA need --hidden, --ffn / --tp and the tokens per rank (--seq x "
        "--batch",
        o.sequence_parallel ? " / --tp" : "", ") to be multiples of 16, got ", o.hidden, ", ",
        o.ffn / o.tp, " and ", tokens);
  return "";
}

}  // namespace

void validate(Options& o, int world, int ranks_per_node) {
  QMESH_CHECK(o.tp >= 1, "--tp must be >= 1, got ", o.tp);
  QMESH_CHECK(world % o.tp == 0, "--tp ", o.tp, " does not divide the number of ranks ", world,
              "; choose tp among the divisors of ", world);
  QMESH_CHECK(o.fsdp >= 1 && world % (o.tp * o.fsdp) == 0, "--fsdp ", o.fsdp, " x --tp ", o.tp,
              " does not divide the number of ranks ", world,
              "; choose fsdp x tp among the divisors of ", world);
  QMESH_CHECK(o.fsdp_prefetch >= 0, "--fsdp-prefetch must be >= 0, got ", o.fsdp_prefetch);
  if (o.dp == 0) o.dp = world / (o.tp * o.fsdp);
  QMESH_CHECK(o.dp >= 1 && o.dp * o.fsdp * o.tp == world, "--dp ", o.dp, " x --fsdp ", o.fsdp,
              " x --tp ", o.tp, " = ", o.dp * o.fsdp * o.tp, " but the job has ", world,
              " ranks; make dp x fsdp x tp equal the ranks");
  QMESH_CHECK(o.layers >= 1, "--layers must be >= 1, got ", o.layers);
  QMESH_CHECK(o.hidden >= 1 && o.hidden % o.tp == 0, "--hidden ", o.hidden,
              " must be a positive multiple of --tp ", o.tp);
  QMESH_CHECK(o.ffn >= 1 && o.ffn % o.tp == 0, "--ffn ", o.ffn,
              " must be a positive multiple of --tp ", o.tp);
  QMESH_CHECK(o.seq >= 1 && o.batch >= 1, "--seq and --batch must be >= 1");
  QMESH_CHECK(!o.sequence_parallel || (o.seq * o.batch) % o.tp == 0,
              "--sequence-parallel needs --seq x --batch (", o.seq * o.batch,
              " tokens) divisible by --tp ", o.tp);
  QMESH_CHECK(o.overlap == qmesh::Overlap::kNone || o.sequence_parallel, "--overlap ",
              qmesh::overlap_name(o.overlap),
              " overlaps the sequence-parallel collectives: add --sequence-parallel or use "
              "--overlap none");
  QMESH_CHECK(!o.regather_input || o.sequence_parallel,
              "--regather-input applies to the sequence-parallel all-gather: add "
              "--sequence-parallel");
  QMESH_CHECK(o.steps >= 1, "--steps must be >= 1, got ", o.steps);
  QMESH_CHECK(o.lr > 0, "--lr must be > 0, got ", o.lr);
  QMESH_CHECK(o.optimizer == "adamw" || o.optimizer == "sgd",
              "--optimizer must be adamw or sgd, "
              "got '",
              o.optimizer, "'");
  QMESH_CHECK(o.log_every >= 1, "--log-every must be >= 1");
  QMESH_CHECK(o.checkpoint_every >= 0, "--checkpoint-every must be >= 0");
  QMESH_CHECK(!o.resume || !o.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  QMESH_CHECK(o.plot.empty() || !o.csv.empty(), "--plot draws the --csv file: give --csv too");
  const std::string obstacle = cuda_obstacle(o, ranks_per_node);
  if (o.device == DeviceChoice::kAuto) {
    o.device = obstacle.empty() ? DeviceChoice::kCuda : DeviceChoice::kCpu;
    if (qmesh::cuda_device_count() > 0) o.cpu_reason = obstacle;
  }
  QMESH_CHECK(o.device != DeviceChoice::kCuda || obstacle.empty(), "--device cuda: ", obstacle,
              "; or use --device cpu");
  QMESH_CHECK(!o.rank_order || o.device == DeviceChoice::kCpu,
              "--rank-order sums host gradients: add --device cpu");
  const bool microscaled = o.recipe == qmesh::Recipe::kMxfp8 || o.recipe == qmesh::Recipe::kNvfp4;
  QMESH_CHECK(!microscaled || !o.sequence_parallel, "--recipe ", qmesh::recipe_name(o.recipe),
              " runs without --sequence-parallel (the collective GEMMs take no MXFP8 or NVFP4 "
              "operands): drop --sequence-parallel, or use --recipe block, delayed or current");
  QMESH_CHECK(!o.fp8_stats || !(microscaled || o.recipe == qmesh::Recipe::kFp8Block),
              "--fp8-stats measures per-tensor FP8 operands: ",
              "use it with --recipe delayed or current, not ", qmesh::recipe_name(o.recipe));
  QMESH_CHECK(!microscaled || o.emulate || o.device != DeviceChoice::kCpu ||
                  qmesh::block_emulation_from_env(),
              "--recipe ", qmesh::recipe_name(o.recipe),
              ": the CPU backend has no native GEMM of that format; add --emulate (or set "
              "QMESH_BLOCK_EMULATION=1) to run its GEMMs emulated (dequantized, then a GEMM "
              "with fp32 accumulation)");
}

}  // namespace train_mlp
