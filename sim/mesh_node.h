// One libtorch autograd node spanning the ranks: its next edges are the locals of every operand
// (operand major, then rank), its backward a function of every rank's gradient at once (so
// collectives can run in the backward). Each local it makes has a node of its own, a RankGrad, which
// hands the gradient that reaches that local to the MeshNode: the MeshNode itself takes one input
// from autograd. libtorch's engine scans a node's inputs every time it hands the node a gradient
// (libtorch 1.x: `Node::stream`, for a CUDA stream), so a node with one input per rank, receiving
// one gradient per rank, cost ranks^2 per op: 20 to 30% of a 4096-rank run (issue #35 item 5).
// On a mesh of at most kDirectRanks ranks that scan costs less than the RankGrads' own runs (each
// node the engine runs sets its thread-local state: 6 to 10% of a property run went to the engine),
// so there the MeshNode takes its outputs' gradients as its own inputs.
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
  // direct: the outputs' gradients are the node's inputs (one per local); else RankGrads hand them over.
  MeshNode(std::string name, Fn fn, size_t n_outputs, bool direct)
      : name_(std::move(name)), fn_(std::move(fn)), grads_(direct ? 0 : n_outputs), direct_(direct) {
    if (!direct) add_input_metadata(Node::undefined_input());  // the RankGrads' edge: no gradient flows through it
  }
  // The gradients of the node's outputs, one per local, as the engine or their RankGrads handed them
  // over (an output no gradient reached stays undefined); the engine runs this node after all of them.
  torch::autograd::variable_list apply(torch::autograd::variable_list&& inputs) override {
    if (!fn_)
      throw std::runtime_error(name_ + ": its backward ran already and its graph was freed (a second backward "
                               "needs the first to keep the graph)");
    if (direct_) return fn_(std::move(inputs));
    torch::autograd::variable_list grads(grads_.size());
    grads.swap(grads_);
    return fn_(std::move(grads));
  }
  void receive(size_t output, at::Tensor grad) { grads_[output] = std::move(grad); }
  // A backward that does not keep the graph frees what the node's backward holds once it ran (its
  // operands, the op's attributes) as libtorch's own nodes free their saved tensors: a long
  // program's graph is gone by the time the oracle runs.
  void release_variables() override { fn_ = nullptr; }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  Fn fn_;
  torch::autograd::variable_list grads_;
  bool direct_;
};

// The node of one local a MeshNode made: one input (the local's gradient, which libtorch's engine
// has already summed over the local's uses) and one edge, to its MeshNode, through which it passes
// nothing: it hands the gradient over directly. It runs before its MeshNode (it is the MeshNode's
// dependency) and right after the last use of its local, in the order the engine would have handed
// that gradient to the MeshNode itself: the MeshNodes run in the same order as without it.
class RankGrad : public torch::autograd::Node {
 public:
  RankGrad(MeshNode* owner, size_t output) : owner_(owner), output_(output) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    owner_->receive(output_, std::move(grads[0]));
    return {at::Tensor()};
  }
  // libtorch's messages name the node that checks a gradient's shape: the MeshNode's name.
  std::string name() const override { return owner_->name(); }

 private:
  MeshNode* owner_;  // alive: this node's next edge owns it
  size_t output_;
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

// The most ranks whose MeshNodes take their gradients directly (see above). Measured on property
// runs (1 to 16 ranks: the engine's share fell); 64 is a choice, not a measured crossover: the
// scan there is 4096 steps per op, against the 4096-rank step's 16.7 M that RankGrads removed.
constexpr size_t kDirectRanks = 64;

// Makes `outputs` the results of a new MeshNode whose next edges are `inputs`.
inline void connect(const std::string& name, const std::vector<at::Tensor>& inputs, Locals& outputs,
                    MeshNode::Fn backward) {
  const bool direct = outputs.size() <= kDirectRanks;
  auto node = make_node<MeshNode>(name, std::move(backward), outputs.size(), direct);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  if (direct) {
    for (auto& o : outputs) torch::autograd::create_gradient_edge(o, node);
    return;
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    auto rank = make_node<RankGrad>(node.get(), k);
    rank->add_next_edge(torch::autograd::Edge(node, 0));
    torch::autograd::create_gradient_edge(outputs[k], rank);
  }
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
