// The cuBLASLt algorithm cache key: every input on which the heuristic's choice depends
// changes the key (amax of D requested, the bias and aux alignment among them), and equal
// problems give equal keys. The plan key (GemmProblem) changes with the same inputs and with
// the device and the staged scalars, but not with where equally aligned tensors live.
#include "ops/gemm_algo_key.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qmesh::detail {
namespace {

alignas(256) uint8_t g_memory[4096];

// An FP8 GEMM with an FP8 D, a bf16 bias and an aux, every pointer 256-byte aligned.
CanonicalGemm base_problem() {
  CanonicalGemm c;
  c.backend = GemmBackend::kCublasLt;
  c.m = 64;
  c.n = 32;
  c.k = 128;
  c.a = {g_memory, DType::kFloat8E4M3, 64, 128, true, nullptr};
  c.b = {g_memory + 256, DType::kFloat8E4M3, 32, 128, true, nullptr};
  c.cm = {true, false, 32, 64, 128, 128, 128, 32};
  c.d = g_memory + 512;
  c.d_dtype = DType::kFloat8E4M3;
  c.epilogue = GemmEpilogue::kBiasGeluAux;
  c.bias = g_memory + 1024;
  c.bias_dtype = DType::kBFloat16;
  c.aux = g_memory + 2048;
  c.aux_dtype = DType::kBFloat16;
  return c;
}

std::string key_of(const CanonicalGemm& c) { return gemm_algo_key(c, "GPU", 1); }

TEST(GemmAlgoKey, EqualProblemsHaveEqualKeys) {
  EXPECT_EQ(key_of(base_problem()), key_of(base_problem()));
  EXPECT_EQ(key_of(base_problem()).find('\t'), std::string::npos)
      << "the file format needs no tabs";
}

using Change = std::pair<const char*, std::function<void(CanonicalGemm&)>>;

// Changes of base_problem() that may change the algorithm.
std::vector<Change> choice_changes() {
  return {
      {"amax of D requested",
       [](CanonicalGemm& c) { c.d_amax = reinterpret_cast<float*>(g_memory + 3072); }},
      {"bias alignment", [](CanonicalGemm& c) { c.bias = g_memory + 1024 + 16; }},
      {"aux alignment", [](CanonicalGemm& c) { c.aux = g_memory + 2048 + 8; }},
      {"A alignment", [](CanonicalGemm& c) { c.a.data = g_memory + 16; }},
      {"D alignment", [](CanonicalGemm& c) { c.d = g_memory + 512 + 32; }},
      {"bias dtype", [](CanonicalGemm& c) { c.bias_dtype = DType::kFloat16; }},
      {"aux dtype", [](CanonicalGemm& c) { c.aux_dtype = DType::kFloat32; }},
      {"epilogue", [](CanonicalGemm& c) { c.epilogue = GemmEpilogue::kBias; }},
      {"D dtype", [](CanonicalGemm& c) { c.d_dtype = DType::kBFloat16; }},
      {"shape", [](CanonicalGemm& c) { c.cm.k = 256; }},
      {"strided batch",
       [](CanonicalGemm& c) {
         c.batch = c.cm.batch = 4;
         c.cm.stride_a = 32 * 128;
         c.cm.stride_b = 64 * 128;
         c.cm.stride_d = 64 * 32;
       }},
      {"accumulation", [](CanonicalGemm& c) { c.accumulation = GemmAccumulation::kSplit; }},
      {"beta", [](CanonicalGemm& c) { c.beta = 1.0f; }},
      {"alpha and beta on the device",
       [](CanonicalGemm& c) { c.device_alpha_beta = reinterpret_cast<float*>(g_memory); }},
      {"A scale mode", [](CanonicalGemm& c) { c.a.scaling = GemmScaling::kBlock1x128; }},
      {"B scale mode", [](CanonicalGemm& c) { c.b.scaling = GemmScaling::kBlock128x128; }},
      {"A and B scale modes swapped",
       [](CanonicalGemm& c) {
         c.a.scaling = GemmScaling::kBlock128x128;
         c.b.scaling = GemmScaling::kBlock1x128;
       }},
  };
}

TEST(GemmAlgoKey, EveryInputOfTheChoiceChangesTheKey) {
  const std::string base = key_of(base_problem());
  for (const auto& [what, change] : choice_changes()) {
    CanonicalGemm c = base_problem();
    change(c);
    EXPECT_NE(key_of(c), base) << what << " must be part of the key";
  }
  EXPECT_NE(gemm_algo_key(base_problem(), "GPU", 2), base) << "library version";
  EXPECT_NE(gemm_algo_key(base_problem(), "Other GPU", 1), base) << "device";
}

TEST(GemmProblem, EveryInputOfThePlanChangesTheProblem) {
  std::vector<Change> changes = choice_changes();
  changes.push_back({"device", [](CanonicalGemm& c) { c.device = Device::cuda(1); }});
  changes.push_back({"a staged scale_inv", [](CanonicalGemm& c) {
                       c.a.scale_inv = reinterpret_cast<const float*>(g_memory + 3076);
                     }});
  changes.push_back({"a staged D scale", [](CanonicalGemm& c) {
                       c.d_scale = reinterpret_cast<float*>(g_memory + 3080);
                     }});
  const GemmProblem base = gemm_problem(base_problem());
  for (const auto& [what, change] : changes) {
    CanonicalGemm c = base_problem();
    change(c);
    EXPECT_NE(gemm_problem(c), base) << what << " must be part of the problem";
  }
}

TEST(GemmProblem, EquallyAlignedTensorsElsewhereShareTheProblem) {
  CanonicalGemm base = base_problem();
  base.a.scale_inv = reinterpret_cast<const float*>(g_memory + 3072);
  CanonicalGemm moved = base;
  moved.a.data = g_memory + 256 * 12;
  moved.b.data = g_memory + 256 * 13;
  moved.d = g_memory + 256 * 14;
  moved.bias = g_memory + 256 * 15;
  moved.aux = g_memory + 256 * 11;
  moved.a.scale_inv = reinterpret_cast<const float*>(g_memory + 3088);
  moved.alpha = 0.5f;  // read from the host at each launch, not part of the plan
  EXPECT_EQ(gemm_problem(moved), gemm_problem(base));
  EXPECT_EQ(gemm_problem(moved).staged_scalars, 0u);
  EXPECT_EQ(gemm_algo_key(moved, "GPU", 1), key_of(base));
}

TEST(GemmAlgoKey, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  EXPECT_EQ(pointer_alignment(nullptr), 256u);
  EXPECT_EQ(pointer_alignment(g_memory), 256u);
  EXPECT_EQ(pointer_alignment(g_memory + 512), 256u);
  EXPECT_EQ(pointer_alignment(g_memory + 48), 16u);
  EXPECT_EQ(pointer_alignment(g_memory + 1), 1u);
  // An FP8 D passes no C: C's alignment is that of nullptr.
  const auto align = gemm_operand_alignments(base_problem());
  EXPECT_EQ(align[2], 256u);
  CanonicalGemm plain = base_problem();
  plain.d_dtype = DType::kFloat32;
  plain.d = g_memory + 8;
  EXPECT_EQ(gemm_operand_alignments(plain)[2], 8u);
}

}  // namespace
}  // namespace qmesh::detail
