#include "qmesh/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "qmesh/layers/fsdp.h"
#include "qmesh/scaling/checkpoint.h"

namespace qmesh {

namespace fs = std::filesystem;

namespace {
std::string rank_file(const fs::path& step_dir, int rank, const char* kind) {
  return (step_dir / ("rank-" + std::to_string(rank) + kind)).string();
}

// <step dir>/layout: "dp fsdp tp" of the run that wrote it.
void save_layout(const fs::path& step_dir, const MeshLayout& l) {
  const std::string path = (step_dir / "layout").string(), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << l.dp << " " << l.fsdp << " " << l.tp << "\n";
    QMESH_CHECK(out.good(), "cannot write ", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  QMESH_CHECK(!ec, "cannot rename ", tmp, " to ", path, ": ", ec.message());
}

// The layout a checkpoint was written with; `current` for checkpoints without the file.
MeshLayout load_layout(const fs::path& step_dir, const MeshLayout& current) {
  std::ifstream in(step_dir / "layout");
  if (!in.good()) return current;
  MeshLayout l;
  in >> l.dp >> l.fsdp >> l.tp;
  QMESH_CHECK(!in.fail() && l.dp >= 1 && l.fsdp >= 1 && l.tp >= 1, (step_dir / "layout").string(),
              " is corrupted: expected 'dp fsdp tp'");
  return l;
}

void copy_elements(const TensorView& dst, int64_t dst_begin, const float* src, int64_t count) {
  copy_bytes(static_cast<float*>(dst.data) + dst_begin, dst.device, src, Device::host(),
             size_t(count) * sizeof(float));
}

// Loads this rank's part of a checkpoint written by the layout `old`: every fsdp shard of
// the tensors from the old ranks of this rank's tp coordinate (dp coordinate 0), unpadded,
// and cut into this layout's shard; the other tensors and the scaling states from the first
// of those ranks. `now`: this run's layout.
void load_resharded(const fs::path& step_dir, const MeshLayout& old, const MeshLayout& now,
                    const CheckpointContent& content, int rank) {
  QMESH_CHECK(old.tp == now.tp && old.fsdp >= 2 && now.fsdp >= 2, "the checkpoint in ",
              step_dir.string(), " was written with dp ", old.dp, " x fsdp ", old.fsdp, " x tp ",
              old.tp, "; it resumes with any dp x fsdp split of fsdp >= 2 and tp ", old.tp,
              " (this run: dp ", now.dp, " x fsdp ", now.fsdp, " x tp ", now.tp, ")");
  const int tp_rank = rank % now.tp, fsdp_rank = (rank / now.tp) % now.fsdp;
  // Unsharded values of the sharded tensors, filled shard by shard.
  std::map<std::string, std::vector<float>> full;
  for (int f = 0; f < old.fsdp; ++f) {
    std::vector<Tensor> storage;
    std::vector<NamedTensor> named;
    for (const auto& [name, view] : content.tensors) {
      const auto it = content.sharded.find(name);
      const Shape shape = it == content.sharded.end()
                              ? view.shape
                              : Shape{FsdpGroup::shard_numel(it->second, old.fsdp, old.dp)};
      storage.emplace_back(view.dtype, shape);
      named.push_back({name, storage.back()});
    }
    const int old_rank = f * old.tp + tp_rank;  // dp coordinate 0
    load_tensors(rank_file(step_dir, old_rank, ".tensors"), named);
    for (size_t i = 0; i < named.size(); ++i) {
      const NamedTensor& dst = content.tensors[i];
      const auto it = content.sharded.find(dst.name);
      if (it == content.sharded.end()) {
        if (f == 0)
          copy_bytes(dst.tensor.data, dst.tensor.device, storage[i].data(), Device::host(),
                     storage[i].nbytes());
        continue;
      }
      std::vector<float>& values = full[dst.name];
      values.resize(size_t(it->second));
      const int64_t s = storage[i].numel(), begin = f * s;
      const int64_t count = std::max<int64_t>(0, std::min(s, it->second - begin));
      const float* src = storage[i].data_as<float>();
      std::copy(src, src + count, values.begin() + begin);
    }
  }
  for (const NamedTensor& dst : content.tensors) {
    const auto it = full.find(dst.name);
    if (it == full.end()) continue;
    const int64_t s = dst.tensor.numel(), n = int64_t(it->second.size());
    std::vector<float> shard(size_t(s), 0.0f);
    const int64_t begin = std::min(n, fsdp_rank * s), end = std::min(n, begin + s);
    std::copy(it->second.begin() + begin, it->second.begin() + end, shard.begin());
    copy_elements(dst.tensor, 0, shard.data(), s);
  }
  if (content.fp8 && content.fp8->recipe() == Recipe::kFp8Delayed)
    load_scaling_states(content.fp8->scaling(), rank_file(step_dir, tp_rank, ".scaling"));
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
  if (rank == 0 && content.layout) save_layout(step_dir, *content.layout);
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
  if (content.layout) {
    const MeshLayout old = load_layout(step_dir, *content.layout);
    if (!(old == *content.layout)) {
      load_resharded(step_dir, old, *content.layout, content, rank);
      return step;
    }
  }
  load_tensors(rank_file(step_dir, rank, ".tensors"), content.tensors);
  if (content.fp8 && content.fp8->recipe() == Recipe::kFp8Delayed)
    load_scaling_states(content.fp8->scaling(), rank_file(step_dir, rank, ".scaling"));
  return step;
}

}  // namespace qmesh
