#include "core/mesh.h"

#include <set>
#include <stdexcept>

namespace meshsim {

Mesh::Mesh(std::vector<std::string> axes, std::vector<int64_t> shape)
    : axes_(std::move(axes)), shape_(std::move(shape)) {
  if (axes_.empty()) throw std::invalid_argument("a mesh needs at least one axis");
  if (axes_.size() != shape_.size())
    throw std::invalid_argument("mesh axes and shape differ in length");
  std::set<std::string> seen;
  for (const auto& a : axes_) {
    if (a.empty()) throw std::invalid_argument("mesh axis names must not be empty");
    if (!seen.insert(a).second) throw std::invalid_argument("duplicate mesh axis \"" + a + "\"");
  }
  strides_.assign(shape_.size(), 1);
  for (int i = static_cast<int>(shape_.size()) - 1; i >= 0; --i) {
    if (shape_[i] < 1) throw std::invalid_argument("mesh axis sizes must be >= 1");
    // Rank arithmetic is int64: a mesh beyond 2^40 ranks (far past any limit) is refused here.
    if (shape_[i] > (int64_t{1} << 40) / size_)
      throw std::invalid_argument("a mesh of more than 2^40 ranks cannot be simulated");
    strides_[i] = size_;
    size_ *= shape_[i];
  }
}

int Mesh::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<int64_t> Mesh::coords(int64_t rank) const {
  std::vector<int64_t> c(shape_.size());
  for (size_t i = 0; i < shape_.size(); ++i) c[i] = (rank / strides_[i]) % shape_[i];
  return c;
}

int64_t Mesh::rank_of(const std::vector<int64_t>& c) const {
  int64_t r = 0;
  for (size_t i = 0; i < shape_.size(); ++i) r += c[i] * strides_[i];
  return r;
}

int64_t Mesh::coord(int64_t rank, int axis) const { return (rank / strides_[axis]) % shape_[axis]; }

std::vector<std::vector<int64_t>> Mesh::groups(int axis) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < size_; ++r) {
    if (coord(r, axis) != 0) continue;
    std::vector<int64_t> g;
    g.reserve(shape_[axis]);
    for (int64_t k = 0; k < shape_[axis]; ++k) g.push_back(r + k * strides_[axis]);
    out.push_back(std::move(g));
  }
  return out;
}

std::string Mesh::str() const {
  std::string out;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (i) out += " x ";
    out += axes_[i] + "=" + std::to_string(shape_[i]);
  }
  return out;
}

}  // namespace meshsim
