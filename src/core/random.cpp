#include "qmesh/random.h"

#include <cmath>

#include "core/splitmix64.h"

namespace qmesh {

namespace {
using detail::splitmix64;
// Uniform in (0, 1]: the top 53 bits, shifted away from 0 so the logarithm is finite.
double unit(uint64_t bits) { return (double(bits >> 11) + 1.0) * 0x1.0p-53; }
}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t stream) { return splitmix64(seed ^ splitmix64(~stream)); }

float counter_normal(uint64_t seed, uint64_t index) {
  const uint64_t h = splitmix64(seed ^ splitmix64(index));
  const double u1 = unit(h), u2 = unit(splitmix64(h));
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace qmesh
