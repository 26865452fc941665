#include "qmesh/comm/composite_work.h"

#include "qmesh/comm/communicator.h"

namespace qmesh {

CompositeWork::CompositeWork(std::string what, const Communicator& issuer)
    : Work(std::move(what), issuer) {}

CompositeWork::CompositeWork(std::string what, std::chrono::milliseconds timeout,
                             TimeoutSource source)
    : Work(std::move(what), timeout, source) {}

CompositeWork::~CompositeWork() { drop_unfinished(); }

void CompositeWork::add(WorkHandle part) {
  if (part) parts_.push_back(std::move(part));
}

TensorView CompositeWork::keep(Tensor buffer) {
  buffers_.push_back(std::move(buffer));
  return buffers_.back();
}

bool CompositeWork::advance() {
  parts_.clear();
  next_stage();
  if (!parts_.empty()) return false;
  buffers_.clear();
  return true;
}

bool CompositeWork::poll() {
  for (;;) {
    for (WorkHandle& part : parts_)
      if (!part->test()) return false;
    if (advance()) return true;
  }
}

bool CompositeWork::block_until(const Deadline& deadline) {
  for (;;) {
    for (WorkHandle& part : parts_) part->wait(deadline.left());
    if (advance()) return true;
  }
}

bool CompositeWork::withdraw() {
  parts_.clear();
  return true;
}

}  // namespace qmesh
