// Loss-curve plots with gnuplot.
#pragma once

#include <string>
#include <vector>

namespace train_mlp {

// Draws step vs loss of every CSV (columns step,loss with a header line) into `png`, one
// line per file labelled with the file name, log-scaled loss axis. Error if gnuplot is
// missing or fails (the message says how to install it).
void plot_loss_curves(const std::vector<std::string>& csv_files, const std::string& png);

}  // namespace train_mlp
