// A Work made of other Works (its parts) and the buffers they read and write: a reduction
// built from point-to-point transfers, or one operation that issues the next when the first
// completes. The composite owns both and destroys them in a safe order, so that no part ever
// touches a buffer that is gone.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "qmesh/comm/work.h"
#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Completes when every part has completed and next_stage() adds no more parts; a part's error
// (its timeout included) is the composite's error. wait() bounds all parts, of every stage,
// by the one deadline. A composite with no parts completes at once (next_stage() runs on the
// first test() or wait()).
//
// Destroying the composite drops its parts first (each withdrawn, or waited for, by its own
// destructor policy; see Work), then frees its buffers. The buffers are freed as soon as the
// composite completes.
class QMESH_API CompositeWork : public Work {
 public:
  // With the timeout (and its source) of `issuer`, the communicator the parts run on.
  CompositeWork(std::string what, const Communicator& issuer);
  CompositeWork(std::string what, std::chrono::milliseconds timeout, TimeoutSource source);
  ~CompositeWork() override;

  // Takes `part` (null: an operation with nothing to wait for, ignored).
  void add(WorkHandle part);
  // Keeps `buffer` alive until every part has been dropped; returns its view, for the parts
  // to use.
  TensorView keep(Tensor buffer);

 protected:
  // Called (on the thread that tests or waits) each time every part added so far has
  // completed: the operation's next step, which may add the parts of a next stage. The
  // default does nothing.
  virtual void next_stage() {}

  bool poll() final;
  bool block_until(const Deadline& deadline) final;
  // Drops every part (so that none uses a buffer any longer): always succeeds.
  bool withdraw() final;

 private:
  // After every part has completed: drops them and runs next_stage(); true (and the buffers
  // freed) when it added no parts.
  bool advance();

  std::vector<Tensor> buffers_;  // before parts_: destroyed after them
  std::vector<WorkHandle> parts_;
};

}  // namespace qmesh
