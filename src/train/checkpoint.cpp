#include "qmesh/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>

#include "core/atomic_file.h"
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
  return content.context && content.context->recipe() == Recipe::kFp8Delayed;
}

// NVFP4 seeds its stochastic rounding and RHT from the context's step count: it is saved.
bool has_step_count(const CheckpointContent& content) {
  return content.context && content.context->recipe() == Recipe::kNvfp4;
}

void check_names_free_of_prefix(const CheckpointContent& content) {
  for (const NamedTensor& t : content.tensors) {
    QMESH_CHECK(!t.name.starts_with(kScalingTensorPrefix), "checkpoint tensor name '", t.name,
                "' starts with '", kScalingTensorPrefix,
                "', which checkpoints keep for the FP8 scaling state; rename it");
    QMESH_CHECK(t.name != kRecipeTensorName && t.name != kStepsTensorName,
                "checkpoint tensor name '", t.name,
                "' is one checkpoints keep for the layer context; rename it");
  }
}

// Checks the recipe and the FP8 scaling state a rank file holds against the content's
// context: the recipe it was saved under must be the context's, a checkpoint under delayed
// scaling must hold a scaling state that fits, and without a context it must hold neither.
void check_context(const std::map<std::string, Tensor>& file, const CheckpointContent& content,
                   const std::string& path) {
  const auto recorded = file.find(std::string(kRecipeTensorName));
  const auto steps = file.find(std::string(kStepsTensorName));
  const bool has_scaling = std::any_of(file.begin(), file.end(), [](const auto& entry) {
    return entry.first.starts_with(kScalingTensorPrefix);
  });
  if (!content.context) {
    QMESH_CHECK(recorded == file.end() && steps == file.end() && !has_scaling, "tensor file ", path,
                " holds a layer context's recipe and FP8 state, but none was given to load "
                "them into; pass the LayerContext (training_checkpoint builds the complete "
                "content)");
    return;
  }
  const Recipe recipe = content.context->recipe();
  if (recorded != file.end()) {
    const Tensor& t = recorded->second;
    QMESH_CHECK(t.dtype() == DType::kInt32 && t.shape() == Shape{1}, "tensor '", kRecipeTensorName,
                "' in ", path, " is not int32 [1]: a corrupted checkpoint?");
    const int32_t saved = *t.data_as<int32_t>();
    QMESH_CHECK(saved == int32_t(recipe), "the checkpoint ", path, " was saved under the '",
                saved >= 0 && saved <= int32_t(Recipe::kNvfp4)
                    ? std::string(recipe_name(Recipe(saved)))
                    : "unknown (" + std::to_string(saved) + ")",
                "' recipe, but this LayerContext's recipe is '", recipe_name(recipe),
                "'; resume with the recipe that saved it");
  }
  if (has_step_count(content))
    QMESH_CHECK(steps != file.end() && steps->second.dtype() == DType::kInt32 &&
                    steps->second.shape() == Shape{1} && *steps->second.data_as<int32_t>() >= 0,
                "the checkpoint ", path, " holds no valid step count ('", kStepsTensorName,
                "', int32 [1], >= 0), which NVFP4 needs to resume its stochastic rounding: it "
                "was saved without its LayerContext (training_checkpoint builds the complete "
                "content)");
  if (!has_scaling_state(content)) {
    QMESH_CHECK(!has_scaling, "the checkpoint ", path,
                " holds an FP8 delayed-scaling state, which this LayerContext's '",
                recipe_name(recipe), "' recipe does not use; resume under delayed scaling");
    return;
  }
  QMESH_CHECK(has_scaling, "the checkpoint ", path,
              " holds no FP8 scaling state, but this LayerContext uses delayed scaling: it was "
              "saved without its LayerContext (training_checkpoint builds the complete content)");
  check_scaling_tensors(content.context->scaling(), file, path);
}

// Checks a rank file read whole: the context's part fits (check_context), and every tensor
// is one of the content's (whose dtypes and shapes stage_direct or the resharding code
// check), the recipe record or of a scaling state.
void check_file(const std::map<std::string, Tensor>& file, const CheckpointContent& content,
                const std::string& path) {
  check_context(file, content, path);
  for (const auto& entry : file) {
    const std::string& name = entry.first;
    QMESH_CHECK(name.starts_with(kScalingTensorPrefix) || name == kRecipeTensorName ||
                    name == kStepsTensorName ||
                    std::any_of(content.tensors.begin(), content.tensors.end(),
                                [&](const NamedTensor& t) { return t.name == name; }),
                "tensor file ", path, " holds '", name,
                "', which this model does not have (a checkpoint of a different model?)");
  }
}

// A rank's part of a checkpoint, read and checked: nothing of the run is written yet.
struct Staged {
  std::vector<Tensor> values;             // content.tensors[i]'s new value, on the host
  std::map<std::string, Tensor> scaling;  // the file holding the scaling state
  std::string scaling_path;               // its path
};

// <step dir>/layout.tensors: the layout of the run that wrote it, as one tensor.
constexpr char kLayoutFile[] = "layout.tensors";
constexpr char kLayoutTensor[] = "layout";  // int32 [3]: dp, fsdp, tp

void save_layout(const fs::path& step_dir, const MeshLayout& l) {
  Tensor t(DType::kInt32, Shape{3});
  int32_t* p = t.data_as<int32_t>();
  p[0] = l.dp, p[1] = l.fsdp, p[2] = l.tp;
  save_tensors((step_dir / kLayoutFile).string(), {{kLayoutTensor, t}});
}

// The layout a checkpoint was written with: its layout.tensors, or the text file `layout`
// ("dp fsdp tp") of checkpoints written before the layout became a tensor, or `current` for
// checkpoints that record none.
MeshLayout load_layout(const fs::path& step_dir, const MeshLayout& current) {
  const std::string path = (step_dir / kLayoutFile).string();
  MeshLayout l;
  if (fs::exists(path)) {
    Tensor t(DType::kInt32, Shape{3});
    load_tensors(path, {{kLayoutTensor, t}});
    const int32_t* p = t.data_as<int32_t>();
    l = {p[0], p[1], p[2]};
    QMESH_CHECK(l.dp >= 1 && l.fsdp >= 1 && l.tp >= 1, path,
                " is corrupted: its dp, fsdp and tp must be >= 1, got ", l.dp, ", ", l.fsdp, ", ",
                l.tp);
    return l;
  }
  std::ifstream text(step_dir / "layout");
  if (!text.good()) return current;
  text >> l.dp >> l.fsdp >> l.tp;
  QMESH_CHECK(!text.fail() && l.dp >= 1 && l.fsdp >= 1 && l.tp >= 1, (step_dir / "layout").string(),
              " is corrupted: expected 'dp fsdp tp'");
  return l;
}

// Stages this rank's part of a checkpoint written by the layout `old` (the same tp, any
// dp x fsdp split, with or without fsdp) from the files of the old ranks of this rank's tp
// coordinate and dp coordinate 0. A tensor is read whole from the first of them, or, when
// that one holds it as a flat fsdp shard, assembled from all of them without the padding;
// then cut into this rank's shard when it is in `content.sharded`, else kept whole. The
// scaling states (one per tp coordinate) come from the first of those files. `now`: this
// run's layout.
Staged stage_resharded(const fs::path& step_dir, const MeshLayout& old, const MeshLayout& now,
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
  Staged staged;
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
    // This rank's value: the whole tensor, or its shard, zero-padded.
    Tensor value(t.dtype(), dst.tensor.shape);
    std::memset(value.data(), 0, value.nbytes());
    const int64_t s = dst.tensor.numel();
    const int64_t begin = cut ? std::min(n, fsdp_rank * s) : 0, end = std::min(n, begin + s);
    std::memcpy(value.data(), full.data() + size_t(begin) * es, size_t(end - begin) * es);
    staged.values.push_back(std::move(value));
  }
  staged.scaling = std::move(files[0]);
  staged.scaling_path = first;
  return staged;
}

// Stages this rank's own file of a checkpoint written by this run's layout.
Staged stage_direct(const fs::path& step_dir, const CheckpointContent& content, int rank) {
  Staged staged;
  staged.scaling_path = rank_file(step_dir, rank);
  const std::string& path = staged.scaling_path;
  staged.scaling = read_tensors(path);
  check_file(staged.scaling, content, path);
  for (const NamedTensor& dst : content.tensors) {
    auto src = staged.scaling.find(dst.name);
    QMESH_CHECK(src != staged.scaling.end(), "tensor file ", path, " lacks '", dst.name, "'");
    QMESH_CHECK(src->second.dtype() == dst.tensor.dtype && src->second.shape() == dst.tensor.shape,
                "tensor '", dst.name, "' in ", path, " is ", dtype_name(src->second.dtype()), " ",
                src->second.shape().str(), ", not the model's ", dtype_name(dst.tensor.dtype), " ",
                dst.tensor.shape.str(), " (a checkpoint of a different configuration?)");
    staged.values.push_back(std::move(src->second));
    staged.scaling.erase(src);
  }
  return staged;
}

// The step <dir>/latest names; Error if there is none or it is corrupted.
int latest_step(const fs::path& dir) {
  const fs::path latest = dir / "latest";
  std::ifstream in(latest);
  QMESH_CHECK(in.good(), "no checkpoint to resume from: ", latest.string(),
              " does not exist (nothing was saved in ", dir.string(), " yet)");
  std::string name;
  in >> name;
  int step = -1;
  const bool parsed =
      name.rfind("step-", 0) == 0 &&
      std::from_chars(name.data() + 5, name.data() + name.size(), step).ec == std::errc() &&
      step >= 0;
  QMESH_CHECK(parsed, latest.string(), " is corrupted: it holds '", name, "' instead of step-<N>");
  return step;
}

// "step-3 step-6" (the checkpoints in `dir`), or "none".
std::string steps_in(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().starts_with("step-"))
      names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : " ") + n;
  return out.empty() ? "none" : out;
}

// Reads and checks this rank's part of checkpoint `step` (or the latest); writes nothing.
Staged stage(const fs::path& dir, int step, const CheckpointContent& content, int rank,
             int world_size) {
  check_names_free_of_prefix(content);
  const fs::path step_dir = dir / ("step-" + std::to_string(step));
  QMESH_CHECK(fs::is_directory(step_dir), "no checkpoint of step ", step, " in ", dir.string(),
              ": ", step_dir.string(), " does not exist (the checkpoints there: ", steps_in(dir),
              ")");
  if (content.layout) {
    const MeshLayout old = load_layout(step_dir, *content.layout);
    if (!(old == *content.layout))
      return stage_resharded(step_dir, old, *content.layout, content, rank);
  } else {
    // Without a layout nothing is resharded: the ranks beyond this world would be dropped.
    const std::string extra = rank_file(step_dir, world_size);
    QMESH_CHECK(!fs::exists(extra), "the checkpoint in ", step_dir.string(),
                " was written by more ranks than this world's ", world_size, " (it has ", extra,
                "); a checkpoint without a mesh layout loads only on the world size that wrote it");
  }
  return stage_direct(step_dir, content, rank);
}

// What fn threw (a qmesh::Error's kind and message, or another exception's: allocation, file
// system, as a runtime error), or nothing.
struct RankError {
  ErrorKind kind;
  std::string message;
};
std::optional<RankError> error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return RankError{e.kind(), e.message()};
  } catch (const std::exception& e) {
    return RankError{ErrorKind::kRuntime, e.what()};
  }
  return std::nullopt;
}

// Collective over `comm`: returns when no rank has an `error`; else throws, on every rank, the
// error of the lowest failing rank (its kind and message travel to the others): "<what> failed
// on rank r of n (<outcome>): <message>".
void agree(Communicator& comm, const std::optional<RankError>& error, const std::string& what,
           const char* outcome) {
  Tensor first(DType::kInt32, Shape{1});
  *first.data_as<int32_t>() = error ? comm.rank() : comm.size();
  comm.all_reduce(first, ReduceOp::kMin);
  const int root = *first.data_as<int32_t>();
  if (root == comm.size()) return;
  Tensor header(DType::kInt32, Shape{2});  // the message's length, the kind
  if (error) {
    header.data_as<int32_t>()[0] = int32_t(error->message.size());
    header.data_as<int32_t>()[1] = int32_t(error->kind);
  }
  comm.broadcast(header, root);
  const int32_t n = header.data_as<int32_t>()[0];
  const auto kind = ErrorKind(header.data_as<int32_t>()[1]);
  Tensor text(DType::kInt32, Shape{std::max<int64_t>(1, (n + 3) / 4)});
  if (comm.rank() == root) std::memcpy(text.data(), error->message.data(), size_t(n));
  comm.broadcast(text, root);
  QMESH_THROW_KIND(kind, what, " failed on rank ", root, " of ", comm.size(), " (", outcome,
                   "): ", std::string(static_cast<const char*>(text.data()), size_t(n)));
}

// The layout of a mesh whose axes are among dp, fsdp, tp in that order; else none.
std::optional<MeshLayout> layout_of(const Mesh& mesh) {
  MeshLayout layout;
  const std::pair<std::string_view, int*> order[] = {
      {"dp", &layout.dp}, {"fsdp", &layout.fsdp}, {"tp", &layout.tp}};
  size_t next = 0;
  for (const MeshAxis& axis : mesh.axes()) {
    while (next < std::size(order) && order[next].first != axis.name) ++next;
    if (next == std::size(order)) return std::nullopt;
    *order[next++].second = axis.size;
  }
  return layout;
}
}  // namespace

CheckpointContent training_checkpoint(LayerContext& context, const std::vector<Parameter*>& params,
                                      Optimizer& optimizer, std::vector<NamedTensor> extra) {
  CheckpointContent content;
  content.tensors = std::move(extra);
  content.context = &context;
  content.layout = layout_of(context.mesh());
  for (const Parameter* p : params) {
    QMESH_CHECK(p != nullptr, "training_checkpoint: a parameter is null");
    content.tensors.push_back({p->name, p->value});
    if (p->fsdp_sharded()) content.sharded[p->name] = p->fsdp_numel;
  }
  for (auto& [name, t] : optimizer.state()) {
    content.tensors.push_back({name, *t});
    for (const Parameter* p : params)  // a sharded parameter's optimizer slots are sharded alike
      if (p->fsdp_sharded() && name.starts_with(p->name + "."))
        content.sharded[name] = p->fsdp_numel;
  }
  return content;
}

void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                     Communicator& world) {
  check_names_free_of_prefix(content);
  const fs::path step_dir = fs::path(dir) / ("step-" + std::to_string(step));
  const int rank = world.rank();
  const std::string what = "saving the checkpoint of step " + std::to_string(step) + " in " + dir;
  const char* outcome = "no `latest` names this step; the previous checkpoint stays the latest";
  // Every rank's files are complete before `latest` names them, and a rank that cannot write
  // them stops every rank (instead of leaving them in the next collective).
  agree(world, error_of([&] {
          std::error_code ec;
          fs::create_directories(step_dir, ec);
          QMESH_CHECK(!ec, "cannot create checkpoint directory ", step_dir.string(), ": ",
                      ec.message());
          std::vector<NamedTensor> tensors = content.tensors;
          std::map<std::string, Tensor> scaling;
          if (has_scaling_state(content)) scaling = scaling_tensors(content.context->scaling());
          for (const auto& [name, t] : scaling) tensors.push_back({name, t});
          Tensor recipe(DType::kInt32, Shape{1}), steps(DType::kInt32, Shape{1});
          if (content.context) {
            *recipe.data_as<int32_t>() = int32_t(content.context->recipe());
            tensors.push_back({std::string(kRecipeTensorName), recipe});
          }
          if (has_step_count(content)) {
            const int64_t n = content.context->steps();
            QMESH_CHECK(n <= INT32_MAX, "the layer context's step count ", n,
                        " does not fit the checkpoint's int32");
            *steps.data_as<int32_t>() = int32_t(n);
            tensors.push_back({std::string(kStepsTensorName), steps});
          }
          save_tensors(rank_file(step_dir, rank), tensors);
          if (rank == 0 && content.layout) save_layout(step_dir, *content.layout);
          // The files of ranks beyond this world, left by an earlier save of a larger one.
          for (int r = world.size(); rank == 0 && fs::exists(rank_file(step_dir, r)); ++r)
            fs::remove(rank_file(step_dir, r), ec);
        }),
        what, outcome);
  agree(world, error_of([&] {
          if (rank != 0) return;
          const std::string name = "step-" + std::to_string(step) + "\n";
          write_file_atomically((fs::path(dir) / "latest").string(),
                                std::vector<uint8_t>(name.begin(), name.end()),
                                "checkpoint pointer");
        }),
        what, outcome);
}

int load_checkpoint(const std::string& dir, const CheckpointContent& content, Communicator& world,
                    std::optional<int> step) {
  int found = -1;
  Staged staged;
  agree(world, error_of([&] {
          QMESH_CHECK(!step || *step >= 0, "checkpoint step ", *step, " is negative");
          found = step ? *step : latest_step(dir);
          staged = stage(dir, found, content, world.rank(), world.size());
        }),
        "loading the checkpoint in " + dir, "no rank changed its state");
  // Every rank read the same step (one shared directory, no save in between).
  Tensor steps(DType::kInt32, Shape{2});
  steps.data_as<int32_t>()[0] = found;
  steps.data_as<int32_t>()[1] = -found;
  world.all_reduce(steps, ReduceOp::kMax);
  QMESH_CHECK(steps.data_as<int32_t>()[0] == -steps.data_as<int32_t>()[1],
              "loading the checkpoint in ", dir, ": the ranks found different steps in it (",
              -steps.data_as<int32_t>()[1], " to ", steps.data_as<int32_t>()[0],
              "): every rank must see the same directory, with no save in progress; no rank "
              "changed its state");
  for (size_t i = 0; i < staged.values.size(); ++i) {
    const TensorView& dst = content.tensors[i].tensor;
    copy_bytes(dst.data, dst.device, staged.values[i].data(), Device::host(), dst.nbytes());
  }
  if (has_scaling_state(content))
    load_scaling_tensors(content.context->scaling(), staged.scaling, staged.scaling_path);
  if (has_step_count(content))
    content.context->set_steps(
        *staged.scaling.at(std::string(kStepsTensorName)).data_as<int32_t>());
  return found;
}

}  // namespace qmesh
