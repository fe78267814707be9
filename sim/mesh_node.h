// One libtorch autograd node spanning the ranks: its inputs are the locals of every operand
// (operand major, then rank), its outputs the locals of the result, its backward a function of
// every rank's gradient at once (so collectives can run in the backward).
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>

#include "sim/collectives.h"

namespace meshsim {

class MeshNode : public torch::autograd::Node {
 public:
  using Fn = std::function<torch::autograd::variable_list(torch::autograd::variable_list&&)>;
  MeshNode(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!fn_)
      throw std::runtime_error(name_ + ": its backward ran already and its graph was freed (a second backward "
                               "needs the first to keep the graph)");
    return fn_(std::move(grads));
  }
  // A backward that does not keep the graph frees what the node's backward holds once it ran (its
  // operands, the op's attributes) as libtorch's own nodes free their saved tensors: a long
  // program's graph is gone by the time the oracle runs.
  void release_variables() override { fn_ = nullptr; }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
};

// A new autograd node, owned the way libtorch owns its own: by a shared_ptr whose deleter frees a
// long graph without recursing (libtorch 1.x: deleteNode), or by an intrusive_ptr where an Edge
// holds one (newer libtorch, which has no deleteNode). Chosen by the type, not by a version.
template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<decltype(torch::autograd::Edge::function), std::shared_ptr<torch::autograd::Node>>) {
    // Unqualified: found by argument-dependent lookup in torch::autograd, and only looked up here.
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), [](T* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// Makes `outputs` the results of a new MeshNode whose next edges are `inputs`.
inline void connect(const std::string& name, const std::vector<at::Tensor>& inputs, Locals& outputs,
                    MeshNode::Fn backward) {
  auto node = make_node<MeshNode>(name, std::move(backward));
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (auto& o : outputs) torch::autograd::create_gradient_edge(o, node);
}

inline bool any_requires_grad(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (t.requires_grad()) return true;
  return false;
}

// The same tensors without autograd history (sharing storage).
inline Locals detached(const Locals& locals) {
  Locals out;
  out.reserve(locals.size());
  for (const auto& t : locals) out.push_back(t.detach());
  return out;
}

// The shapes and options of a node's outputs, without holding the tensors (a node that held its
// own outputs would keep itself alive): enough for the zeros of a gradient that did not flow.
class LocalShapes {
 public:
  explicit LocalShapes(const Locals& locals) {
    sizes_.reserve(locals.size());
    for (const auto& t : locals) sizes_.push_back(t.sizes().vec());
    if (!locals.empty()) options_ = locals.front().options();
  }
  // Gradients that did not flow (an unused output) become zeros of the output's shape.
  Locals defined(torch::autograd::variable_list&& grads) const {
    Locals out(sizes_.size());
    for (size_t r = 0; r < sizes_.size(); ++r) out[r] = grads[r].defined() ? grads[r] : at::zeros(sizes_[r], options_);
    return out;
  }

 private:
  std::vector<std::vector<int64_t>> sizes_;
  at::TensorOptions options_;
};

}  // namespace meshsim
