// The collective GEMMs over NCCL, the stream-native backend, with the only NCCL world one GPU
// can host: one rank. That is the degenerate tp = 1 schedule (NCCL's all-gather of the one
// chunk on the comm stream, the GEMM ordered after it by an event, no host wait), checked
// against the float64 reference for fp32, bf16 and FP8 operands; the rings themselves are
// tested with virtual ranks of the local backend (collective_gemm_gpu_test). Skipped without
// a GPU.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "collective_gemm_gpu_checks.h"
#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/nccl.h"

namespace qmesh {
namespace {

using namespace testing_overlap;

class CollectiveGemmNcclOneRank : public ::testing::TestWithParam<Operands> {
 protected:
  void SetUp() override {
    gpu_test_setup();
    if (IsSkipped()) return;
    const auto dir = std::filesystem::temp_directory_path() /
                     ("qmesh_cgemm_nccl_test_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    StoreBootstrap bootstrap(std::make_shared<FileStore>(dir), 0, 1, "cgemm_nccl");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    comm_ = make_nccl_world(bootstrap);
    std::filesystem::remove_all(dir);
  }

  std::shared_ptr<Communicator> comm_;
};

TEST_P(CollectiveGemmNcclOneRank, AllGatherGemm) { check_all_gather_gemm_gpu(*comm_, GetParam()); }

TEST_P(CollectiveGemmNcclOneRank, OperandGather) { check_operand_gather_gpu(*comm_, GetParam()); }

// With one rank there is nothing to reduce: the call is the GEMM itself (no ring, no NCCL
// transfer); the test checks that path's result and stream order, not a reduction.
TEST_P(CollectiveGemmNcclOneRank, GemmReduceScatterIsThePlainGemm) {
  check_gemm_reduce_scatter_gpu(*comm_, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Operands, CollectiveGemmNcclOneRank,
                         ::testing::Values(Operands::kFp32, Operands::kBf16, Operands::kFp8),
                         [](const ::testing::TestParamInfo<Operands>& p) {
                           return std::string(operands_name(p.param));
                         });

}  // namespace
}  // namespace qmesh
