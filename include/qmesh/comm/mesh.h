// The device mesh: named parallelism axes over the world communicator, with a communicator
// per axis and per group of axes (e.g. "every axis except pp" for the global amax
// reduction), a role mapping (dp/tp/fsdp/pp, like TransformerEngine JAX's MeshResource)
// and the host topology.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

struct MeshAxis {
  std::string name;  // non-empty, unique within the mesh
  int size = 1;      // >= 1
};

// Which mesh axis plays which parallelism role; an empty name means the role is absent.
// The defaults "dp" and "tp" are only names: when the mesh has no axis of that name the role
// is taken as absent. Any other role naming an axis that the mesh lacks is an Error, and two
// roles may not share one axis.
struct MeshResource {
  std::string dp = "dp";
  std::string tp = "tp";
  std::string fsdp{};
  std::string pp{};
};

// Rank layout: the last axis varies fastest, so for axes {{"dp",2},{"tp",4}} world rank
// r has coordinates dp = r / 4, tp = r % 4 (tp groups are runs of consecutive ranks, which
// is what keeps a tp group on one host when ranks are packed per host).
//
// Construction is collective over `world` and blocking (bounded by world->timeout(); the axes'
// communicators inherit world's timeout setting, so one set on `world` before holds for all): it
// builds, eagerly, one communicator for every non-empty subset of the axes (2^n - 1 splits
// of the world, with n <= kMaxAxes), so that every accessor below is local, cheap and
// cannot deadlock whatever order ranks call it in. It also gathers host ids and logs a
// warning when the tp role's axis spans hosts (allowed, but slow).
class QMESH_API Mesh {
 public:
  static constexpr int kMaxAxes = 6;

  // Error if an axis name is empty or repeated, a size is <= 0, the product of the sizes
  // differs from world->size(), there are more than kMaxAxes axes, or `roles` is invalid
  // (see MeshResource).
  Mesh(std::shared_ptr<Communicator> world, std::vector<MeshAxis> axes, MeshResource roles = {});

  const std::vector<MeshAxis>& axes() const { return axes_; }
  // Size of the named axis; Error naming the known axes if there is none.
  int axis_size(std::string_view name) const;
  // This rank's coordinate along the named axis.
  int coord(std::string_view name) const;
  // Coordinates of a world rank, one per axis in axis order (pure math, any rank).
  std::vector<int> coords_of(int world_rank) const;
  // World rank of the given coordinates (one per axis; Error if out of range).
  int rank_of(const std::vector<int>& coords) const;

  // The ranks that differ from this one only along `name`, ordered by that coordinate
  // (so axis(name)->rank() == coord(name)).
  std::shared_ptr<Communicator> axis(std::string_view name) const;
  // The ranks that differ from this one only along the given axes (a non-empty set of
  // distinct known axes, in any order), ordered by world rank.
  std::shared_ptr<Communicator> group(const std::vector<std::string>& axes) const;
  // Every axis except the pp role's axis: the group over which amax is reduced. With no pp
  // role (or a mesh whose only axis is pp) this is the world (respectively a size-1 group).
  std::shared_ptr<Communicator> amax_group() const;
  // The communicator of a role's axis: axis(role_name), or a size-1 communicator holding
  // only this rank when role_name is empty (the role is absent).
  std::shared_ptr<Communicator> role(std::string_view role_name) const;
  std::shared_ptr<Communicator> world() const { return world_; }
  const MeshResource& resource() const { return roles_; }

  // Host topology gathered at construction: host id of every world rank (see
  // Communicator::host_ids) and whether a given axis's groups contain ranks on different
  // hosts.
  const std::vector<int>& host_ids() const { return host_ids_; }
  bool axis_spans_hosts(std::string_view name) const;

 private:
  int axis_index(std::string_view name) const;
  unsigned mask_of(const std::vector<std::string>& axes) const;

  std::shared_ptr<Communicator> world_;
  std::vector<MeshAxis> axes_;
  MeshResource roles_;
  std::vector<int> coords_;
  std::vector<int> host_ids_;
  std::shared_ptr<Communicator> self_;
  std::map<unsigned, std::shared_ptr<Communicator>> groups_;  // by bit mask of axis indices
};

}  // namespace qmesh
