// fp8_roundtrip: quantizes a random tensor to FP8 with a per-tensor scale and reports what
// the round trip costs: scale, amax, relative error and signal-to-noise ratio, for E4M3
// and E5M2 and a few margins. A first look at what FP8 does to a tensor.
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <vector>

#include "qmesh/error.h"
#include "qmesh/fp8.h"
#include "qmesh/version.h"

namespace po = boost::program_options;

namespace {

struct Options {
  int64_t elements = 1 << 20;
  double outlier_fraction = 1e-3;
  double outlier_scale = 50.0;
  unsigned seed = 0;
};

struct Report {
  double scale, amax, rel_error, snr_db;
};

Report roundtrip(const std::vector<float>& x, qmesh::DType fp8, int margin) {
  double amax = 0;
  for (float v : x) amax = std::max(amax, double(std::abs(v)));
  // Current scaling: map amax onto the format's largest value, less 2^margin headroom.
  const float scale = float(qmesh::fp8_max(fp8) / amax / std::exp2(margin));
  std::vector<uint8_t> q(x.size());
  std::vector<float> back(x.size());
  qmesh::fp32_to_fp8(x.data(), q.data(), x.size(), fp8, scale);
  qmesh::fp8_to_fp32(q.data(), back.data(), x.size(), fp8, 1.0f / scale);
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(back[i]) - x[i]) * (double(back[i]) - x[i]);
    ref += double(x[i]) * x[i];
  }
  return {scale, amax, std::sqrt(err / ref), 10 * std::log10(ref / err)};
}

}  // namespace

int main(int argc, char** argv) try {
  Options opt;
  po::options_description desc(
      "fp8_roundtrip: quantize a random tensor to FP8 and report the round-trip error\n"
      "Options");
  desc.add_options()("help,h", "show this help")(
      "elements,n", po::value(&opt.elements)->default_value(opt.elements), "tensor size")(
      "outlier-fraction", po::value(&opt.outlier_fraction)->default_value(opt.outlier_fraction),
      "fraction of elements drawn with a larger spread (activation outliers)")(
      "outlier-scale", po::value(&opt.outlier_scale)->default_value(opt.outlier_scale),
      "standard deviation of the outliers (the rest have 1)")(
      "seed", po::value(&opt.seed)->default_value(opt.seed), "random seed");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  QMESH_CHECK(opt.elements > 0, "--elements must be >= 1, got ", opt.elements);
  QMESH_CHECK(opt.outlier_fraction >= 0 && opt.outlier_fraction <= 1,
              "--outlier-fraction must be in [0, 1], got ", opt.outlier_fraction);

  std::mt19937 rng(opt.seed);
  std::normal_distribution<float> body(0.0f, 1.0f), outlier(0.0f, float(opt.outlier_scale));
  std::bernoulli_distribution is_outlier(opt.outlier_fraction);
  std::vector<float> x(size_t(opt.elements));
  for (auto& v : x) v = is_outlier(rng) ? outlier(rng) : body(rng);

  std::printf("%s\n%lld elements, %.3g%% outliers (std %.3g)\n\n", qmesh::build_info().c_str(),
              static_cast<long long>(opt.elements), 100 * opt.outlier_fraction, opt.outlier_scale);
  std::printf("%-8s %6s %12s %12s %12s %9s\n", "format", "margin", "amax", "scale", "rel.error",
              "SNR dB");
  for (qmesh::DType fp8 : {qmesh::DType::kFloat8E4M3, qmesh::DType::kFloat8E5M2}) {
    for (int margin : {0, 1, 2}) {
      const Report r = roundtrip(x, fp8, margin);
      std::printf("%-8s %6d %12.5g %12.5g %12.4e %9.2f\n",
                  std::string(qmesh::dtype_name(fp8)).c_str(), margin, r.amax, r.scale, r.rel_error,
                  r.snr_db);
    }
  }
  return 0;
} catch (const po::error& e) {
  std::cerr << "fp8_roundtrip: " << e.what() << " (see --help)\n";
  return 2;
} catch (const std::exception& e) {
  std::cerr << "fp8_roundtrip: " << e.what() << "\n";
  return 1;
}
