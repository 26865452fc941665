/* A peer that dies in the middle of a job, seen through the C API: rank 1 is killed
 * (SIGKILL) after a first all-reduce, and rank 0's next all-reduce must return
 * QMESH_ERROR_FAILED with a message saying what timed out (QMESH_COMM_TIMEOUT_S), not hang
 * or abort. Prints "<status name>: <message>" and exits 3 on the expected failure.
 * Run by c_api_dead_peer_test.sh under mpirun --enable-recovery. */
#include <signal.h>
#include <stdio.h>

#include "qmesh/c_api.h"

int main(int argc, char** argv) {
  qmesh_world* world = NULL;
  if (qmesh_world_create_mpi(&argc, &argv, &world) != QMESH_OK) {
    fprintf(stderr, "world: %s\n", qmesh_last_error());
    return 1;
  }
  int rank = 0;
  qmesh_world_rank(world, &rank);
  double v = 1.0;
  const int64_t one = 1;
  const qmesh_tensor t = qmesh_host_tensor(&v, QMESH_FLOAT64, 1, &one);
  if (qmesh_world_all_reduce(world, &t, QMESH_SUM) != QMESH_OK || v != 2.0) {
    fprintf(stderr, "first all-reduce: %s\n", qmesh_last_error());
    return 1;
  }
  if (rank == 1) raise(SIGKILL);
  for (int i = 0; i < 1000; ++i) {
    const qmesh_status status = qmesh_world_all_reduce(world, &t, QMESH_SUM);
    if (status != QMESH_OK) {
      printf("%s: %s\n", qmesh_status_name(status), qmesh_last_error());
      fflush(stdout);
      return 3; /* not qmesh_world_destroy: MPI_Finalize would wait for the dead rank */
    }
  }
  printf("no failure seen\n");
  return 0;
}
