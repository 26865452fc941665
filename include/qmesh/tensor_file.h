// Named-tensor files: what checkpoints are made of (weights, optimizer state, the FP8
// delayed-scaling state of qmesh/scaling/checkpoint.h, a run's configuration).
//
// Format (little-endian): magic "QMTENSOR", u32 version, u32 count; per tensor: u32 name
// length, name bytes, u8 dtype, u8 rank, i64 dims[rank], then the raw data; finally a u32
// CRC-32 of every byte before it. Written atomically (temporary file, fsync, rename).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

inline constexpr uint32_t kTensorFileVersion = 1;

struct NamedTensor {
  std::string name;
  TensorView tensor;  // host or device; read or written in place
};

// Writes the tensors (names unique) to `path` atomically. Blocking.
QMESH_API void save_tensors(const std::string& path, const std::vector<NamedTensor>& tensors);

// Reads `path` into the given tensors. The file must hold exactly these names, each with the
// same dtype and shape; it is checked completely (magic, version, length, checksum, names,
// shapes) before any tensor is written, so on any Error the tensors are left untouched.
QMESH_API void load_tensors(const std::string& path, const std::vector<NamedTensor>& tensors);

// Every tensor of `path` as a host tensor, by name (for a reader that does not know the
// shapes in advance, e.g. a checkpoint written by another mesh layout). The whole file is
// checked (magic, version, length, checksum, every header) before anything is returned, so
// this also verifies a file: it returns only for an intact one.
QMESH_API std::map<std::string, Tensor> read_tensors(const std::string& path);

// Copies tensors of `file` (as read_tensors returns it; `path` names it in errors) into the
// given tensors: `file` must hold each of their names with the same dtype and shape, and may
// hold others. Everything is checked before any tensor is written, as in load_tensors.
QMESH_API void copy_tensors(const std::map<std::string, Tensor>& file,
                            const std::vector<NamedTensor>& tensors, const std::string& path);

}  // namespace qmesh
