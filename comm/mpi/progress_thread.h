// Background progress for nonblocking MPI operations. Open MPI moves the data of large
// messages (rendezvous protocols) only inside MPI calls, so a transfer posted before a long
// computation would otherwise wait for the computation to end. While any operation of the
// MPI backend is in flight, this thread enters the MPI library every
// QMESH_MPI_PROGRESS_INTERVAL_US microseconds (MPI_Iprobe on MPI_COMM_SELF, which runs the
// progress engine and matches nothing); when none is, it sleeps on a condition variable.
//
// On when MPI provides MPI_THREAD_MULTIPLE and QMESH_MPI_PROGRESS_THREAD is not 0. Started on
// first use; MpiSession stops it (stop()) before MPI_Finalize, so that the thread is never
// inside MPI while MPI shuts down.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

namespace qmesh::mpi {

class ProgressThread {
 public:
  // Keeps the thread polling while it lives. Move-only; an empty one does nothing.
  class Active {
   public:
    Active() = default;
    explicit Active(ProgressThread* owner);
    Active(Active&& other) noexcept;
    Active& operator=(Active&& other) noexcept;
    ~Active();
    void release();

   private:
    ProgressThread* owner_ = nullptr;
  };

  // An Active for a new in-flight operation; empty when background progress is off or
  // stopped.
  static Active track();
  // Ends the thread (joins it) if it was started; later operations get no background
  // progress. Call before MPI_Finalize.
  static void stop();

 private:
  ProgressThread();  // the one instance lives until the process exits (never destroyed)
  static ProgressThread* started();
  void run();
  void begin();
  void end();

  std::mutex mu_;
  std::condition_variable wake_;
  int active_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace qmesh::mpi
