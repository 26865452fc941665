#include "qmesh/shape.h"

#include <limits>

#include "qmesh/error.h"

namespace qmesh {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (size_t i = 0; i < dims_.size(); ++i) {
    const int64_t d = dims_[i];
    QMESH_CHECK(d > 0, "shape ", str(), ": dimension ", i, " is ", d,
                "; every dimension must be >= 1");
    QMESH_CHECK(numel_ <= std::numeric_limits<int64_t>::max() / d, "shape ", str(),
                ": element count overflows int64");
    numel_ *= d;
  }
}

int64_t Shape::dim(int i) const {
  const int r = rank();
  QMESH_CHECK(i >= -r && i < r, "dimension index ", i, " is out of range for shape ", str());
  return dims_[static_cast<size_t>(i < 0 ? i + r : i)];
}

int64_t Shape::rows() const { return rank() == 0 ? 1 : numel_ / dims_.back(); }
int64_t Shape::cols() const { return rank() == 0 ? 1 : dims_.back(); }

std::string Shape::str() const {
  std::string out = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(dims_[i]);
  }
  return out + "]";
}

}  // namespace qmesh
