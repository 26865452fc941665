#include "qmesh/comm/mesh.h"

#include <map>
#include <set>
#include <tuple>

#include "qmesh/error.h"
#include "qmesh/logging.h"

namespace qmesh {

namespace {

std::string axis_list(const std::vector<MeshAxis>& axes) {
  std::string out;
  for (const auto& a : axes)
    out += (out.empty() ? "" : ", ") + a.name + "=" + std::to_string(a.size);
  return "{" + out + "}";
}

}  // namespace

Mesh::Mesh(std::shared_ptr<Communicator> world, std::vector<MeshAxis> axes, MeshResource roles)
    : world_(std::move(world)), axes_(std::move(axes)), roles_(std::move(roles)) {
  QMESH_CHECK(world_ != nullptr, "Mesh needs a world communicator");
  QMESH_CHECK(!axes_.empty(), "a mesh needs at least one axis");
  QMESH_CHECK(static_cast<int>(axes_.size()) <= kMaxAxes, "mesh ", axis_list(axes_), " has ",
              axes_.size(), " axes; at most ", kMaxAxes, " are supported");
  std::set<std::string> names;
  double product = 1;  // exact for any real world size, cannot overflow
  for (const auto& a : axes_) {
    QMESH_CHECK(!a.name.empty(), "mesh axis names must be non-empty: ", axis_list(axes_));
    QMESH_CHECK(names.insert(a.name).second, "mesh axis name '", a.name, "' appears twice in ",
                axis_list(axes_));
    QMESH_CHECK(a.size >= 1, "mesh axis '", a.name, "' has size ", a.size, "; sizes must be >= 1");
    product *= a.size;
  }
  QMESH_CHECK(product == world_->size(), "mesh ", axis_list(axes_), " has ", product,
              " ranks but the world communicator has ", world_->size(),
              "; the product of the axis sizes must equal the world size");

  // Roles: the default names are dropped when absent; anything else must name an axis, and
  // no two roles share one.
  const MeshResource defaults;
  std::map<std::string, std::string> role_of_axis;
  for (auto [role, name, fallback] :
       {std::tuple{"dp", &roles_.dp, defaults.dp}, std::tuple{"tp", &roles_.tp, defaults.tp},
        std::tuple{"fsdp", &roles_.fsdp, defaults.fsdp},
        std::tuple{"pp", &roles_.pp, defaults.pp}}) {
    if (name->empty()) continue;
    if (!names.count(*name)) {
      QMESH_CHECK(*name == fallback, "MeshResource role ", role, " names axis '", *name,
                  "', which the mesh ", axis_list(axes_), " does not have");
      name->clear();
      continue;
    }
    const auto [it, inserted] = role_of_axis.emplace(*name, role);
    QMESH_CHECK(inserted, "MeshResource roles ", it->second, " and ", role, " both name axis '",
                *name, "'; give each role its own axis");
  }

  coords_ = coords_of(world_->rank());
  host_ids_ = world_->host_ids();

  // One split per subset of axes (mask bit i = axis i varies within the group); the colour
  // is the linear index of the coordinates that stay fixed.
  const int n = static_cast<int>(axes_.size());
  for (unsigned mask = 0; mask < (1u << n); ++mask) {
    int color = 0;
    for (int i = 0; i < n; ++i) {
      if (!(mask & (1u << i))) color = color * axes_[i].size + coords_[i];
    }
    groups_[mask] = world_->split(color, world_->rank());
  }
  self_ = groups_.at(0);

  if (!roles_.tp.empty() && axis_spans_hosts(roles_.tp) && world_->rank() == 0) {
    QMESH_LOG_WARN("mesh ", axis_list(axes_), ": the tp axis '", roles_.tp,
                   "' spans hosts, so tensor-parallel traffic crosses the network (slow); "
                   "make tp the last axis and at most the number of GPUs per host");
  }
}

int Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name == name) return static_cast<int>(i);
  }
  QMESH_THROW("mesh ", axis_list(axes_), " has no axis named '", name, "'");
}

int Mesh::axis_size(std::string_view name) const { return axes_[axis_index(name)].size; }

int Mesh::coord(std::string_view name) const { return coords_[axis_index(name)]; }

std::vector<int> Mesh::coords_of(int world_rank) const {
  comm_check::peer(world_rank, world_->size(), "mesh world rank");
  std::vector<int> coords(axes_.size());
  for (int i = static_cast<int>(axes_.size()) - 1; i >= 0; --i) {
    coords[i] = world_rank % axes_[i].size;
    world_rank /= axes_[i].size;
  }
  return coords;
}

int Mesh::rank_of(const std::vector<int>& coords) const {
  QMESH_CHECK(coords.size() == axes_.size(), "rank_of got ", coords.size(),
              " coordinates for mesh ", axis_list(axes_), " with ", axes_.size(), " axes");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    QMESH_CHECK(coords[i] >= 0 && coords[i] < axes_[i].size, "coordinate ", coords[i], " of axis '",
                axes_[i].name, "' is out of range [0, ", axes_[i].size, ")");
    rank = rank * axes_[i].size + coords[i];
  }
  return rank;
}

unsigned Mesh::mask_of(const std::vector<std::string>& axes) const {
  QMESH_CHECK(!axes.empty(), "Mesh::group needs at least one axis");
  unsigned mask = 0;
  for (const auto& name : axes) {
    const unsigned bit = 1u << axis_index(name);
    QMESH_CHECK(!(mask & bit), "axis '", name, "' is listed twice in a mesh group");
    mask |= bit;
  }
  return mask;
}

std::shared_ptr<Communicator> Mesh::axis(std::string_view name) const {
  return groups_.at(1u << axis_index(name));
}

std::shared_ptr<Communicator> Mesh::group(const std::vector<std::string>& axes) const {
  return groups_.at(mask_of(axes));
}

std::shared_ptr<Communicator> Mesh::amax_group() const {
  unsigned mask = (1u << axes_.size()) - 1;
  if (!roles_.pp.empty()) mask &= ~(1u << axis_index(roles_.pp));
  return groups_.at(mask);
}

std::shared_ptr<Communicator> Mesh::role(std::string_view role_name) const {
  return role_name.empty() ? self_ : axis(role_name);
}

bool Mesh::axis_spans_hosts(std::string_view name) const {
  const int i = axis_index(name);
  for (int r = 0; r < world_->size(); ++r) {
    std::vector<int> first = coords_of(r);
    first[i] = 0;
    if (host_ids_[r] != host_ids_[rank_of(first)]) return true;
  }
  return false;
}

}  // namespace qmesh
