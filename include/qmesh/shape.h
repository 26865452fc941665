// Shape of a dense tensor: a list of dimensions, each >= 1, whose product fits in int64_t.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "qmesh/export.h"

namespace qmesh {

class QMESH_API Shape {
 public:
  // A rank-0 shape (one element).
  Shape() = default;
  // Throws qmesh::Error if a dimension is <= 0 or the element count overflows int64_t.
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  // Dimension i; negative i counts from the back (-1 is the last). Out of range: Error.
  int64_t dim(int i) const;
  const std::vector<int64_t>& dims() const { return dims_; }
  // Product of all dimensions (1 for rank 0).
  int64_t numel() const { return numel_; }
  // Rows and columns of the row-major 2-D view: rows = product of all but the last dim.
  int64_t rows() const;
  int64_t cols() const;

  bool operator==(const Shape& other) const { return dims_ == other.dims_; }
  // "[2, 3, 4]"
  std::string str() const;

 private:
  std::vector<int64_t> dims_;
  int64_t numel_ = 1;
};

}  // namespace qmesh
