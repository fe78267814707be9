// A device mesh: named axes with sizes; ranks are numbered row-major over the axes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshsim {

class Mesh {
 public:
  Mesh() = default;
  // Throws std::invalid_argument for empty, duplicate or unnamed axes and sizes < 1.
  Mesh(std::vector<std::string> axes, std::vector<int64_t> shape);

  const std::vector<std::string>& axes() const { return axes_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(axes_.size()); }
  int64_t size() const { return size_; }
  int64_t axis_size(int axis) const { return shape_.at(axis); }
  // Index of a named axis, or -1.
  int axis_index(const std::string& name) const;

  std::vector<int64_t> coords(int64_t rank) const;
  int64_t rank_of(const std::vector<int64_t>& coords) const;
  // The groups of a collective over `axis`: every group holds the ranks that differ only in their
  // coordinate on `axis`, ordered by that coordinate; groups are ordered by their first rank.
  std::vector<std::vector<int64_t>> groups(int axis) const;
  // The coordinate of `rank` on `axis` (its position in its group).
  int64_t coord(int64_t rank, int axis) const;

  std::string str() const;  // "dp=2 x tp=4"
  bool operator==(const Mesh& o) const { return axes_ == o.axes_ && shape_ == o.shape_; }
  bool operator!=(const Mesh& o) const { return !(*this == o); }

 private:
  std::vector<std::string> axes_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t size_ = 1;
};

}  // namespace meshsim
