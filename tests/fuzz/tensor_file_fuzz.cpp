// libFuzzer target: load_tensors on arbitrary files (a valid CRC appended). Any input must
// load or throw qmesh::Error; a crash, hang or sanitizer report is a bug.
#include "fuzz_file.h"
#include "qmesh/error.h"
#include "qmesh/tensor_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qmesh;
  static Tensor weight(DType::kFloat32, Shape{4, 3});
  static Tensor bias(DType::kBFloat16, Shape{3});
  static Tensor step(DType::kInt32, Shape{1});
  const std::string path = fuzz::file_with_crc(data, size);
  try {
    load_tensors(path, {{"weight", weight}, {"bias", bias}, {"step", step}});
  } catch (const Error&) {
  }
  return 0;
}
