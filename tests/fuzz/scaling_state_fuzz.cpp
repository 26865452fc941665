// libFuzzer target: load_scaling_states (a tensor file's "scaling.*" tensors, checked against
// the state) on arbitrary files (a valid CRC appended). Any input must load or throw
// qmesh::Error; a crash, hang or sanitizer report is a bug. Seeds: a state of this target's
// shape, one of another, one next to a parameter (a train checkpoint's rank file) and one of
// the separate format of earlier versions.
#include "fuzz_file.h"
#include "qmesh/error.h"
#include "qmesh/scaling/checkpoint.h"
#include "qmesh/scaling/scaling_states.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qmesh;
  static ScalingStates states = [] {
    DelayedScaling recipe;
    recipe.amax_history_len = 4;
    return ScalingStates(recipe,
                         {OperandRole::kInput, OperandRole::kWeight, OperandRole::kGradOutput});
  }();
  const std::string path = fuzz::file_with_crc(data, size);
  try {
    load_scaling_states(states, path);
  } catch (const Error&) {
  }
  return 0;
}
