// A 4-rank job in which one rank dies (SIGKILL) in the middle of a series of collectives:
// all-reduces, ring collective GEMMs (GEMM + reduce-scatter, Overlap::kRing), or bucketed
// data-parallel gradient reductions (GradSync, several buckets in flight), over the MPI
// backend or UCX (test_world.h: QMESH_TEST_WORLD=ucx); in mode `world` it dies before
// creating the world (after MPI_Init), while the others create it (make_mpi_world; over UCX,
// its MPI bootstrap and make_ucx_world), then the others run all-reduces. Every surviving rank
// must notice through its own timeout: it writes what happened to <dir>/rank<r>.txt
// ("FAILED <unix ms> <message>"), prints the error and exits with status 1, as any qmesh
// program catches qmesh::Error in main. The victim writes <dir>/victim.txt ("KILLED <unix
// ms>") just before it dies. kill_rank_test.sh checks the files. With victim -1 nobody dies
// (the fault comes from outside, e.g. a network link taken down: tests/multinode, or a
// signal: tests/faults); every rank writes <dir>/started<r> after its first step.
//
// usage: mpi_kill_rank <result dir> <victim rank|-1> <all_reduce|ring|grad_sync|world>
//                      [steps (10)]
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "qmesh/comm/mpi.h"
#include "qmesh/error.h"
#include "qmesh/overlap/collective_gemm.h"
#include "qmesh/train/grad_sync.h"
#include "test_world.h"

namespace {

long long unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text << "\n";
}

// The victim records its death and dies.
[[noreturn]] void die(const std::string& dir) {
  write_file(dir + "/victim.txt", "KILLED " + std::to_string(unix_ms()));
  std::raise(SIGKILL);
  std::abort();  // not reached
}

// This process's rank in MPI_COMM_WORLD (from the launcher, before any qmesh world exists).
int world_rank() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return rank ? std::atoi(rank) : -1;
}

// The rank's share of the job; throws qmesh::Error when a peer failed.
void run(const std::string& dir, int victim, const std::string& mode, int steps,
         const std::shared_ptr<qmesh::Communicator>& world) {
  const int rank = world->rank();
  using qmesh::DType, qmesh::Shape, qmesh::Tensor;
  Tensor buf(DType::kFloat32, Shape{1 << 18});
  // Ring: partial products [4 x 64 tokens, 256] of every rank reduce-scattered to [64, 256].
  Tensor a(DType::kFloat32, Shape{256, 128}), b(DType::kFloat32, Shape{256, 128}),
      d(DType::kFloat32, Shape{64, 256});
  qmesh::GemmArgs args;
  args.a = qmesh::GemmOperand::plain(a);
  args.b = qmesh::GemmOperand::plain(b);
  args.trans_b = qmesh::GemmTranspose::kYes;
  args.d = d;
  // grad_sync: four gradients, one bucket each, all in flight when the victim dies. The
  // GradSync lives in this scope, as in a trainer, so it is destroyed while unwinding.
  std::vector<qmesh::Parameter> params;
  for (int i = 0; i < 4; ++i)
    params.push_back({qmesh::detail::concat("p", i), Tensor(DType::kFloat32, Shape{1 << 16}),
                      Tensor(DType::kFloat32, Shape{1 << 16})});
  std::vector<qmesh::Parameter*> ptrs;
  for (auto& p : params) ptrs.push_back(&p);
  qmesh::GradSync sync(world, ptrs, 1 << 18);
  for (int step = 0; step < steps; ++step) {
    if (step == 1) write_file(dir + "/started" + std::to_string(rank), "");
    if (rank == victim && step == 3) die(dir);
    if (mode == "ring") {
      qmesh::gemm_reduce_scatter(*world, args, qmesh::Overlap::kRing);
    } else if (mode == "grad_sync") {
      for (qmesh::Parameter* p : ptrs) sync.ready({p});
      sync.finish();
    } else {
      world->all_reduce(buf, qmesh::ReduceOp::kSum);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 4 || argc == 5 ? argv[3] : "";
  if (mode != "all_reduce" && mode != "ring" && mode != "grad_sync" && mode != "world") {
    std::fprintf(stderr,
                 "usage: %s <result dir> <victim rank|-1> <all_reduce|ring|grad_sync|world> "
                 "[steps]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int victim = std::atoi(argv[2]);
  const int steps = argc == 5 ? std::atoi(argv[4]) : 10;
  int rank = -1;  // known once the world exists
  try {
    qmesh::MpiSession session(&argc, &argv);
    if (mode == "world" && victim == world_rank()) die(dir);
    auto world = qmesh::testing_world::world();
    rank = world->rank();
    run(dir, victim, mode, steps, world);
  } catch (const qmesh::Error& e) {
    if (rank < 0) rank = world_rank();
    write_file(dir + "/rank" + std::to_string(rank) + ".txt",
               "FAILED " + std::to_string(unix_ms()) + " " + e.what());
    std::fprintf(stderr, "mpi_kill_rank: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    // Not a normal return: MPI must not be finalized, and the destructors of unfinished UCX
    // operations would wait for the dead rank once more. Exit at once with a failure status.
    std::_Exit(1);
  }
  write_file(dir + "/rank" + std::to_string(rank) + ".txt",
             "COMPLETED " + std::to_string(unix_ms()));
  return 0;
}
