// The choice between the native and the emulated GEMM of microscaled operands
// (ops/microscaled_gemm_path.h), for every kind of device, with and without emulation.
#include "ops/microscaled_gemm_path.h"

#include <gtest/gtest.h>

#include "expect_error.h"

namespace qmesh::detail {
namespace {

MicroscaledGemmTarget gpu(const char* name, int major, int minor) {
  MicroscaledGemmTarget t;
  t.cuda = true;
  t.name = name;
  t.major = major;
  t.minor = minor;
  return t;
}

MicroscaledGemmTarget host() {
  MicroscaledGemmTarget t;
  t.host = true;
  t.name = "cpu";
  return t;
}

TEST(MicroscaledGemmPath, BlackwellAndLaterRunNativelyWithOrWithoutEmulation) {
  for (bool emulate : {false, true}) {
    EXPECT_EQ(choose_microscaled_gemm_path(gpu("NVIDIA B200", 10, 0), "MXFP8", emulate),
              MicroscaledGemmPath::kNative);
    EXPECT_EQ(choose_microscaled_gemm_path(gpu("NVIDIA B200", 10, 0), "NVFP4", emulate),
              MicroscaledGemmPath::kNative);
    EXPECT_EQ(choose_microscaled_gemm_path(gpu("NVIDIA GB300", 10, 3), "NVFP4", emulate),
              MicroscaledGemmPath::kNative);
    EXPECT_EQ(choose_microscaled_gemm_path(gpu("NVIDIA RTX PRO 6000", 12, 0), "MXFP8", emulate),
              MicroscaledGemmPath::kNative);
  }
}

TEST(MicroscaledGemmPath, OlderGpusAndTheHostRunEmulatedOnlyWhenAsked) {
  EXPECT_EQ(choose_microscaled_gemm_path(gpu("NVIDIA H100", 9, 0), "MXFP8", true),
            MicroscaledGemmPath::kEmulated);
  EXPECT_EQ(choose_microscaled_gemm_path(gpu("NVIDIA H100", 9, 0), "NVFP4", true),
            MicroscaledGemmPath::kEmulated);
  EXPECT_QMESH_ERROR(choose_microscaled_gemm_path(gpu("NVIDIA H100", 9, 0), "NVFP4", false),
                     "NVFP4 GEMMs need compute capability 10.0 (Blackwell); this is NVIDIA H100 "
                     "(9.0). Set NVFP4BlockScaling(emulate=True)");
  EXPECT_EQ(choose_microscaled_gemm_path(host(), "NVFP4", true), MicroscaledGemmPath::kEmulated);
  EXPECT_QMESH_ERROR(choose_microscaled_gemm_path(gpu("NVIDIA H100", 9, 0), "MXFP8", false),
                     "MXFP8 GEMMs need compute capability 10.0 (Blackwell); this is NVIDIA H100 "
                     "(9.0). Set MXFP8BlockScaling(emulate=True)");
  EXPECT_QMESH_ERROR(choose_microscaled_gemm_path(host(), "NVFP4", false),
                     "the host backend has no native NVFP4 GEMM. Set "
                     "NVFP4BlockScaling(emulate=True)");
  EXPECT_QMESH_ERROR(choose_microscaled_gemm_path(host(), "MXFP8", false),
                     "QMESH_BLOCK_EMULATION=1");
}

TEST(MicroscaledGemmPath, ACudaDeviceOfABuildWithoutCudaIsNeverNative) {
  MicroscaledGemmTarget t;
  t.name = "cuda:0";
  t.major = 10;  // never set without CUDA; the flag decides
  EXPECT_EQ(choose_microscaled_gemm_path(t, "MXFP8", true), MicroscaledGemmPath::kEmulated);
  EXPECT_QMESH_ERROR(choose_microscaled_gemm_path(t, "MXFP8", false),
                     "qmesh was built without CUDA, so cuda:0 is unusable");
}

TEST(MicroscaledGemmPath, TheHostTargetIsTheHost) {
  const MicroscaledGemmTarget t = microscaled_gemm_target(Device::host());
  EXPECT_TRUE(t.host);
  EXPECT_FALSE(t.cuda);
  EXPECT_EQ(choose_microscaled_gemm_path(t, "MXFP8", true), MicroscaledGemmPath::kEmulated);
}

}  // namespace
}  // namespace qmesh::detail
