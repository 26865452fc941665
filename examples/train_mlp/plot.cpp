#include "plot.h"

#include <cstdio>
#include <filesystem>

#include "qmesh/error.h"

namespace train_mlp {

void plot_loss_curves(const std::vector<std::string>& csv_files, const std::string& png) {
  for (const auto& f : csv_files)
    QMESH_CHECK(std::filesystem::exists(f), "cannot plot ", f, ": no such file");
  FILE* gp = ::popen("gnuplot", "w");
  QMESH_CHECK(gp != nullptr, "cannot start gnuplot; install it (apt-get install gnuplot-nox)");
  std::fprintf(gp,
               "set terminal pngcairo size 900,560 font ',11'\n"
               "set output '%s'\n"
               "set datafile separator ','\n"
               "set termoption noenhanced\nset key top right\nset grid\nset logscale y\n"
               "set xlabel 'step'\nset ylabel 'loss (MSE)'\n"
               "set title 'train_mlp loss'\nplot ",
               png.c_str());
  for (size_t i = 0; i < csv_files.size(); ++i) {
    const std::string label = std::filesystem::path(csv_files[i]).stem().string();
    std::fprintf(gp, "%s'%s' every ::1 using 1:2 with lines linewidth 2 title '%s'", i ? ", " : "",
                 csv_files[i].c_str(), label.c_str());
  }
  std::fprintf(gp, "\n");
  const int status = ::pclose(gp);
  QMESH_CHECK(status == 0, "gnuplot failed (exit status ", status, ") drawing ", png,
              "; is gnuplot installed with the pngcairo terminal (apt-get install gnuplot-nox)?");
}

}  // namespace train_mlp
