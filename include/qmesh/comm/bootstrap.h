// Bootstrap: how ranks find each other before a transport exists (NCCL unique ids, UCX
// worker addresses, hostnames). Injected, never hard-wired: a Store (key/value), or a
// Bootstrap (all-gather of byte strings) over a store, over MPI (qmesh/comm/mpi.h) or over
// any existing Communicator.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "qmesh/comm/work.h"
#include "qmesh/export.h"

namespace qmesh {

class Communicator;

// A key/value store shared by the ranks of a job. Keys are non-empty and made of
// [A-Za-z0-9._-] (Error otherwise). Values are arbitrary bytes. Thread-safe.
class QMESH_API Store {
 public:
  virtual ~Store();
  // Publishes `value` under `key` (atomically: readers see all of it or nothing). Setting a
  // key twice replaces the value.
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists, then returns its value. Throws qmesh::Error after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  std::string get(const std::string& key);  // timeout comm_timeout()
};

// A Store in a directory that every rank can see (a local or shared file system): one file
// per key, written to a temporary name and renamed. The directory is created if missing; use
// a fresh directory per job (keys of an earlier job would be read as this job's).
class QMESH_API FileStore : public Store {
 public:
  explicit FileStore(std::filesystem::path dir);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  using Store::get;

 private:
  std::filesystem::path dir_;
};

// Collective exchange of byte strings among `size` ranks.
class QMESH_API Bootstrap {
 public:
  virtual ~Bootstrap();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every rank passes its string; returns all of them in rank order. Throws
  // qmesh::Error after `timeout`.
  virtual std::vector<std::string> all_gather(const std::string& mine,
                                              std::chrono::milliseconds timeout) = 0;
  std::vector<std::string> all_gather(const std::string& mine);  // timeout comm_timeout()
  // Collective: every rank returns root's `value` (other ranks' values are ignored).
  std::string broadcast(const std::string& value, int root);
};

// A Bootstrap over a Store: call i of all_gather sets "<prefix>.<i>.<rank>" and gets the
// other ranks' keys. 0 <= rank < size. Every rank of one job must use the same prefix.
class QMESH_API StoreBootstrap : public Bootstrap {
 public:
  StoreBootstrap(std::shared_ptr<Store> store, int rank, int size, std::string prefix = "qmesh");
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> all_gather(const std::string& mine,
                                      std::chrono::milliseconds timeout) override;
  using Bootstrap::all_gather;

 private:
  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  std::string prefix_;
  uint64_t round_ = 0;
};

// A Bootstrap over an existing communicator's collectives (host buffers), e.g. a UCX or
// NCCL world bootstrapped from an MPI world.
QMESH_API std::unique_ptr<Bootstrap> make_comm_bootstrap(std::shared_ptr<Communicator> comm);

// This machine's host name (gethostname), for host_ids().
QMESH_API std::string host_name();
// Numbers hosts in order of their first appearance: {"b","a","b"} -> {0, 1, 0}. Backends
// use it to implement Communicator::host_ids from gathered host names.
QMESH_API std::vector<int> number_hosts(const std::vector<std::string>& host_names);

}  // namespace qmesh
