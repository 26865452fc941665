// Every one of the 2^32 float32 bit patterns, converted by qmesh and by CUDA's own host
// conversions (__nv_cvt_float_to_fp8 with __NV_SATFINITE, __float2bfloat16_rn,
// __float2half_rn), which compile with plain g++ from the CUDA headers. Split over threads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <thread>
#include <vector>

#include "qmesh/float16.h"
#include "qmesh/fp8.h"

namespace qmesh {
namespace {

// Runs check(bits) for every uint32 on all hardware threads; returns mismatch count and
// the first mismatching pattern.
template <class Check>
std::pair<uint64_t, uint32_t> for_all_floats(Check check) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint32_t> first{0};
  std::vector<std::thread> pool;
  const uint64_t total = uint64_t(1) << 32;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const uint64_t begin = total * t / threads, end = total * (t + 1) / threads;
      uint64_t local = 0;
      for (uint64_t b = begin; b < end; ++b) {
        if (!check(uint32_t(b))) {
          if (local++ == 0) first.store(uint32_t(b));
        }
      }
      mismatches += local;
    });
  }
  for (auto& th : pool) th.join();
  return {mismatches.load(), first.load()};
}

TEST(Exhaustive, E4M3MatchesCuda) {
  auto [bad, first] = for_all_floats([](uint32_t b) {
    const float x = std::bit_cast<float>(b);
    return float_to_e4m3(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  });
  EXPECT_EQ(bad, 0u) << "first mismatch at float bits 0x" << std::hex << first;
}

TEST(Exhaustive, E5M2MatchesCuda) {
  auto [bad, first] = for_all_floats([](uint32_t b) {
    const float x = std::bit_cast<float>(b);
    return float_to_e5m2(x) == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  });
  EXPECT_EQ(bad, 0u) << "first mismatch at float bits 0x" << std::hex << first;
}

// bf16 and fp16: identical codes for every non-NaN input; NaN must stay NaN (CUDA returns
// one canonical NaN, qmesh keeps the payload's top bits).
TEST(Exhaustive, BFloat16MatchesCuda) {
  auto [bad, first] = for_all_floats([](uint32_t b) {
    const float x = std::bit_cast<float>(b);
    const uint16_t ours = float_to_bf16(x);
    const uint16_t cuda = __nv_bfloat16_raw(__float2bfloat16_rn(x)).x;
    if (std::isnan(x)) return std::isnan(bf16_to_float(ours));
    return ours == cuda;
  });
  EXPECT_EQ(bad, 0u) << "first mismatch at float bits 0x" << std::hex << first;
}

TEST(Exhaustive, Float16MatchesCuda) {
  auto [bad, first] = for_all_floats([](uint32_t b) {
    const float x = std::bit_cast<float>(b);
    const uint16_t ours = float_to_fp16(x);
    const uint16_t cuda = __half_raw(__float2half_rn(x)).x;
    if (std::isnan(x)) return std::isnan(fp16_to_float(ours));
    return ours == cuda;
  });
  EXPECT_EQ(bad, 0u) << "first mismatch at float bits 0x" << std::hex << first;
}

TEST(Exhaustive, AllFp8DecodesMatchCuda) {
  for (int c = 0; c < 256; ++c) {
    for (auto [fmt, ours] : {std::pair{__NV_E4M3, e4m3_to_float(uint8_t(c))},
                             std::pair{__NV_E5M2, e5m2_to_float(uint8_t(c))}}) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), fmt);
      const float cuda = __half2float(__half(h));
      if (std::isnan(cuda))
        EXPECT_TRUE(std::isnan(ours)) << c;
      else
        EXPECT_EQ(ours, cuda) << "code " << c << " format " << int(fmt);
    }
  }
}

}  // namespace
}  // namespace qmesh
