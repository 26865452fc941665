#include "qmesh/train/checkpoint.h"

#include <charconv>
#include <filesystem>
#include <fstream>

#include "qmesh/error.h"
#include "qmesh/scaling/checkpoint.h"

namespace qmesh {

namespace fs = std::filesystem;

namespace {
std::string rank_file(const fs::path& step_dir, int rank, const char* kind) {
  return (step_dir / ("rank-" + std::to_string(rank) + kind)).string();
}
}  // namespace

void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                     Communicator& world) {
  const fs::path step_dir = fs::path(dir) / ("step-" + std::to_string(step));
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  QMESH_CHECK(!ec, "cannot create checkpoint directory ", step_dir.string(), ": ", ec.message());
  const int rank = world.rank();
  save_tensors(rank_file(step_dir, rank, ".tensors"), content.tensors);
  if (content.fp8 && content.fp8->recipe() == Recipe::kFp8Delayed)
    save_scaling_states(content.fp8->scaling(), rank_file(step_dir, rank, ".scaling"));
  world.barrier();  // every rank's files are complete before `latest` names them
  if (rank == 0) {
    const std::string latest = (fs::path(dir) / "latest").string();
    const std::string tmp = latest + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "step-" << step << "\n";
      QMESH_CHECK(out.good(), "cannot write ", tmp);
    }
    fs::rename(tmp, latest, ec);
    QMESH_CHECK(!ec, "cannot rename ", tmp, " to ", latest, ": ", ec.message());
  }
  world.barrier();
}

int load_latest_checkpoint(const std::string& dir, const CheckpointContent& content, int rank) {
  const fs::path latest = fs::path(dir) / "latest";
  std::ifstream in(latest);
  QMESH_CHECK(in.good(), "no checkpoint to resume from: ", latest.string(),
              " does not exist (run once with --checkpoint-dir ", dir, " first, or drop --resume)");
  std::string name;
  in >> name;
  int step = -1;
  const bool parsed =
      name.rfind("step-", 0) == 0 &&
      std::from_chars(name.data() + 5, name.data() + name.size(), step).ec == std::errc() &&
      step >= 0;
  QMESH_CHECK(parsed, latest.string(), " is corrupted: it holds '", name, "' instead of step-<N>");
  const fs::path step_dir = fs::path(dir) / name;
  load_tensors(rank_file(step_dir, rank, ".tensors"), content.tensors);
  if (content.fp8 && content.fp8->recipe() == Recipe::kFp8Delayed)
    load_scaling_states(content.fp8->scaling(), rank_file(step_dir, rank, ".scaling"));
  return step;
}

}  // namespace qmesh
