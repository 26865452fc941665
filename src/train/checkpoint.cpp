#include "qmesh/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "qmesh/layers/fsdp.h"
#include "qmesh/scaling/checkpoint.h"

namespace qmesh {

namespace fs = std::filesystem;

namespace {
// A rank's one file of a checkpoint: its tensors and, under delayed scaling, its scaling state.
std::string rank_file(const fs::path& step_dir, int rank) {
  return (step_dir / ("rank-" + std::to_string(rank) + ".tensors")).string();
}

bool has_scaling_state(const CheckpointContent& content) {
  return content.fp8 && content.fp8->recipe() == Recipe::kFp8Delayed;
}

void check_names_free_of_prefix(const CheckpointContent& content) {
  for (const NamedTensor& t : content.tensors)
    QMESH_CHECK(!t.name.starts_with(kScalingTensorPrefix), "checkpoint tensor name '", t.name,
                "' starts with '", kScalingTensorPrefix,
                "', which checkpoints keep for the FP8 scaling state; rename it");
}

// Checks a rank file read whole: every tensor is one of the content's (whose dtypes and
// shapes copy_tensors or the resharding code check) or of a scaling state, and the scaling
// state fits this run's when it has one. A scaling state this run does not need is ignored
// (the run's own configuration check reports a change of recipe).
void check_file(const std::map<std::string, Tensor>& file, const CheckpointContent& content,
                const std::string& path) {
  for (const auto& entry : file) {
    const std::string& name = entry.first;
    QMESH_CHECK(name.starts_with(kScalingTensorPrefix) ||
                    std::any_of(content.tensors.begin(), content.tensors.end(),
                                [&](const NamedTensor& t) { return t.name == name; }),
                "tensor file ", path, " holds '", name,
                "', which this model does not have (a checkpoint of a different model?)");
  }
  if (has_scaling_state(content)) check_scaling_tensors(content.fp8->scaling(), file, path);
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

// Loads this rank's part of a checkpoint written by the layout `old` (the same tp, any
// dp x fsdp split, with or without fsdp) from the files of the old ranks of this rank's tp
// coordinate and dp coordinate 0. A tensor is read whole from the first of them, or, when
// that one holds it as a flat fsdp shard, assembled from all of them without the padding;
// then cut into this rank's shard when it is in `content.sharded`, else kept whole. The
// scaling states (one per tp coordinate) come from the first of those files. `now`: this
// run's layout.
void load_resharded(const fs::path& step_dir, const MeshLayout& old, const MeshLayout& now,
                    const CheckpointContent& content, int rank) {
  QMESH_CHECK(old.tp == now.tp, "the checkpoint in ", step_dir.string(), " was written with dp ",
              old.dp, " x fsdp ", old.fsdp, " x tp ", old.tp, "; resume it with tp ", old.tp,
              " (any dp x fsdp split, with or without fsdp), not with this run's dp ", now.dp,
              " x fsdp ", now.fsdp, " x tp ", now.tp);
  const int tp_rank = rank % now.tp, fsdp_rank = (rank / now.tp) % now.fsdp;
  std::vector<std::map<std::string, Tensor>> files;  // old fsdp coordinate -> its tensors
  for (int f = 0; f < old.fsdp; ++f)
    files.push_back(read_tensors(rank_file(step_dir, f * old.tp + tp_rank)));
  const std::string first = rank_file(step_dir, tp_rank);
  check_file(files[0], content, first);
  std::vector<std::vector<char>> values;  // this rank's part of each tensor, checked first
  for (const NamedTensor& dst : content.tensors) {
    const auto src = files[0].find(dst.name);
    QMESH_CHECK(src != files[0].end(), "tensor file ", first, " lacks '", dst.name, "'");
    const Tensor& t = src->second;
    const auto sharded = content.sharded.find(dst.name);
    const bool cut = sharded != content.sharded.end();
    const int64_t n = cut ? sharded->second : dst.tensor.numel();
    const bool flat_shard =
        old.fsdp >= 2 && t.shape() == Shape{FsdpGroup::shard_numel(n, old.fsdp, old.dp)};
    const bool assemble = flat_shard && (cut || !(t.shape() == dst.tensor.shape));
    const bool whole = !assemble && t.numel() == n && (cut || t.shape() == dst.tensor.shape);
    QMESH_CHECK(t.dtype() == dst.tensor.dtype && (assemble || whole), "tensor '", dst.name, "' in ",
                first, " is ", dtype_name(t.dtype()), " ", t.shape().str(),
                ", which is neither this run's ", dtype_name(dst.tensor.dtype), " ",
                dst.tensor.shape.str(), " nor a shard of it (a checkpoint of a different ",
                "configuration?)");
    // The unsharded value: one file's tensor, or every old rank's shard without the padding.
    const size_t es = dtype_size(t.dtype());
    std::vector<char> full(size_t(n) * es);
    for (int f = 0; f < (assemble ? old.fsdp : 1); ++f) {
      const auto other = files[size_t(f)].find(dst.name);
      QMESH_CHECK(other != files[size_t(f)].end() && other->second.shape() == t.shape() &&
                      other->second.dtype() == t.dtype(),
                  "tensor '", dst.name, "' is missing or differs in shape in ",
                  rank_file(step_dir, f * old.tp + tp_rank), " (compared with ", first,
                  "): a corrupted checkpoint?");
      const Tensor& part = other->second;
      const int64_t begin = f * part.numel();
      const int64_t count = std::max<int64_t>(0, std::min(part.numel(), n - begin));
      if (count > 0) std::memcpy(full.data() + size_t(begin) * es, part.data(), size_t(count) * es);
    }
    if (!cut) {
      values.push_back(std::move(full));
      continue;
    }
    const int64_t s = dst.tensor.numel();  // this rank's shard, zero-padded
    std::vector<char> shard(size_t(s) * es, 0);
    const int64_t begin = std::min(n, fsdp_rank * s), end = std::min(n, begin + s);
    std::memcpy(shard.data(), full.data() + size_t(begin) * es, size_t(end - begin) * es);
    values.push_back(std::move(shard));
  }
  for (size_t i = 0; i < values.size(); ++i)
    copy_bytes(content.tensors[i].tensor.data, content.tensors[i].tensor.device, values[i].data(),
               Device::host(), values[i].size());
  if (has_scaling_state(content)) load_scaling_tensors(content.fp8->scaling(), files[0], first);
}
}  // namespace

void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                     Communicator& world) {
  check_names_free_of_prefix(content);
  const fs::path step_dir = fs::path(dir) / ("step-" + std::to_string(step));
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  QMESH_CHECK(!ec, "cannot create checkpoint directory ", step_dir.string(), ": ", ec.message());
  const int rank = world.rank();
  std::vector<NamedTensor> tensors = content.tensors;
  std::map<std::string, Tensor> scaling;
  if (has_scaling_state(content)) scaling = scaling_tensors(content.fp8->scaling());
  for (const auto& [name, t] : scaling) tensors.push_back({name, t});
  save_tensors(rank_file(step_dir, rank), tensors);
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
  check_names_free_of_prefix(content);
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
  // Everything is checked before anything is written.
  const std::string path = rank_file(step_dir, rank);
  const std::map<std::string, Tensor> file = read_tensors(path);
  check_file(file, content, path);
  copy_tensors(file, content.tensors, path);
  if (has_scaling_state(content)) load_scaling_tensors(content.fp8->scaling(), file, path);
  return step;
}

}  // namespace qmesh
