// Command line of train_mlp (Boost.Program_options) and its validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qmesh/layers/layer_context.h"

namespace train_mlp {

// Where the layers run: kAuto resolves (in validate) to kCuda when the run can work there (a
// GPU per rank of a node, NCCL, options the CUDA path supports), else kCpu.
enum class DeviceChoice { kAuto, kCpu, kCuda };

struct Options {
  int dp = 0;  // 0: world size / (fsdp x tp)
  int fsdp = 1;
  int fsdp_prefetch = 1;  // layers whose weight all-gather runs ahead (FsdpOptions::prefetch)
  int tp = 1;
  bool rank_order = false;  // sum gradients over the data-parallel ranks in rank order
  int layers = 2;
  int64_t hidden = 256;
  int64_t ffn = 1024;
  int64_t seq = 64;
  int64_t batch = 8;  // sequences per data-parallel rank and step
  int steps = 200;
  float lr = 3e-3f;
  std::string optimizer = "adamw";
  qmesh::Recipe recipe = qmesh::Recipe::kFp8Delayed;
  int amax_history = 16;
  float margin = 0.0f;
  bool sequence_parallel = false;
  bool regather_input = false;  // fc1's gathered input: kept (false) or gathered again
  qmesh::Overlap overlap = qmesh::Overlap::kNone;  // collective-GEMM schedule (needs sp)
  DeviceChoice device = DeviceChoice::kAuto;
  std::string cpu_reason;  // set by validate when --device auto chose the CPU despite a GPU
  uint64_t seed = 1234;
  int log_every = 10;
  bool timing = false;  // split the step time into compute, exposed communication and idle
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  bool resume = false;
  bool emulate = false;    // --recipe mxfp8 / nvfp4: run their GEMMs emulated
  bool fp8_stats = false;  // print rank 0's per-operand FP8 precision statistics at the end
  std::string csv;
  std::string plot;
  std::vector<std::string> compare;
};

// Parses argv. Returns nullopt after printing --help. Throws qmesh::Error (bad values) or
// boost::program_options::error (bad syntax) with a message for the user.
std::optional<Options> parse_options(int argc, char** argv);

// Checks the options against the world size (e.g. dp * fsdp * tp == world, sizes divisible by tp)
// and the machine (--device cuda needs a GPU for each of the ranks_per_node ranks of the
// fullest node), fills dp when it was left 0 and resolves --device auto. The same on every
// rank. Throws qmesh::Error naming the option.
void validate(Options& options, int world_size, int ranks_per_node);

}  // namespace train_mlp
