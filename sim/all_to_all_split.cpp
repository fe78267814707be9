// all_to_all with split sizes in local code (all_to_all_single's input_split_sizes and
// output_split_sizes): the sizes are int64 data of the body, checked on every group before anything
// moves; the backward moves the gradient by the transposed sizes. docs/semantics.md, "all_to_all
// with split sizes".
#include <algorithm>
#include <stdexcept>
#include <string>

#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/layout.h"
#include "core/mutants.h"
#include "core/scoped.h"
#include "sim/communicator.h"
#include "sim/local_map.h"
#include "sim/mesh_node.h"

namespace meshsim {

using torch::autograd::variable_list;

namespace {

// Rank `rank`'s split sizes from `t` (its local: an int64 vector of one entry per member, none
// negative), or an error naming the operand, the rank and what is wrong.
std::vector<int64_t> split_sizes(const LTensor& t, int64_t rank, size_t members, const std::string& path,
                                 const std::string& which) {
  const at::Tensor& local = t.locals.at(static_cast<size_t>(rank));
  const std::string where = path + ": all_to_all's " + which + " \"" + t.name + "\" ";
  if (local.scalar_type() != at::kLong)
    throw SemanticError(ErrorKind::InvalidScenario, where + "is " + std::string(c10::toString(local.scalar_type())) +
                                                        " on rank " + std::to_string(rank) + ", split sizes are int64");
  if (local.dim() != 1 || local.size(0) != static_cast<int64_t>(members))
    throw SemanticError(ErrorKind::ShapeMismatch, where + "has shape " + shape_str(local.sizes().vec()) + " on rank " +
                                                      std::to_string(rank) + ", expected [" + std::to_string(members) +
                                                      "] (one size per member of the group)");
  const at::Tensor c = local.detach().contiguous();
  std::vector<int64_t> sizes(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + members);
  for (size_t s = 0; s < members; ++s)
    if (sizes[s] < 0)
      throw SemanticError(ErrorKind::ShapeMismatch, where + "holds " + std::to_string(sizes[s]) + " at " +
                                                        std::to_string(s) + " on rank " + std::to_string(rank) +
                                                        ": a split size is never negative");
  return sizes;
}

std::string sizes_str(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// Bytes a rank sends to the other members (its piece to itself stays), the largest over the mesh.
int64_t split_bytes(const std::vector<std::pair<Ranks, SplitTable>>& tables, const Locals& in) {
  int64_t most = 0;
  for (const auto& [ranks, sends] : tables)
    for (size_t k = 0; k < ranks.size(); ++k) {
      const at::Tensor& t = in[static_cast<size_t>(ranks[k])];
      const int64_t row = t.size(0) ? t.numel() / t.size(0) : 0;
      int64_t rows = 0;
      for (size_t s = 0; s < ranks.size(); ++s) rows += s == k ? 0 : sends[k][s];
      most = std::max(most, rows * row * static_cast<int64_t>(t.element_size()));
    }
  return most;
}

// Moves every group's locals by its table (through the current engine).
Locals move_split(const std::vector<std::pair<Ranks, SplitTable>>& tables, const Locals& in, bool transpose) {
  Locals out(in.size());
  for (const auto& [ranks, sends] : tables) {
    Locals group;
    for (auto r : ranks) group.push_back(in[static_cast<size_t>(r)]);
    const SplitTable table = transpose ? transposed(sends) : sends;
    for (size_t k = 0; k < ranks.size(); ++k) {  // the backward's gradient rows against its sizes
      int64_t rows = 0;
      for (int64_t v : table[k]) rows += v;
      const int64_t have = group[k].dim() == 0 ? 0 : group[k].size(0);
      if (rows != have)
        throw std::runtime_error("all_to_all: rank " + std::to_string(ranks[k]) + " splits " + std::to_string(have) +
                                 " rows by sizes " + sizes_str(table[k]) + " that sum to " + std::to_string(rows));
    }
    const Locals moved = communicator().all_to_all_split(ranks, group, table);
    for (size_t k = 0; k < ranks.size(); ++k) out[static_cast<size_t>(ranks[k])] = moved[k];
  }
  return out;
}

}  // namespace

LTensor BodyContext::all_to_all_split(const LTensor& in, const LTensor& input_sizes, const LTensor& output_sizes,
                                      int axis, const std::string& out, const std::string& path) {
  check_mesh({in, input_sizes, output_sizes}, "all_to_all");
  const Mesh& mesh = rt_.mesh();
  const Unreduced left = carried(in, axis, "all_to_all", true, false);
  LTensor x = varying_on(in, axis, out);
  // Sizes that differ over another axis give locals that differ there: x varies there too.
  for (const LTensor* sizes : {&input_sizes, &output_sizes})
    for (int b : sizes->variant)
      if (b != axis && !x.variant.count(b)) x = varying_on(x, b, out);
  std::vector<std::pair<Ranks, SplitTable>> tables;
  for (const auto& ranks : mesh.groups(axis)) {
    const size_t n = ranks.size();
    SplitTable sends, receives;
    for (size_t k = 0; k < n; ++k) {
      sends.push_back(split_sizes(input_sizes, ranks[k], n, path, "input_split_sizes"));
      receives.push_back(split_sizes(output_sizes, ranks[k], n, path, "output_split_sizes"));
    }
    for (size_t k = 0; k < n; ++k) {
      const at::Tensor& local = x.locals.at(static_cast<size_t>(ranks[k]));
      int64_t total = 0;
      for (int64_t v : sends[k]) total += v;
      if (local.dim() == 0 || local.size(0) != total)
        throw SemanticError(ErrorKind::ShapeMismatch,
                            path + ": all_to_all's input_split_sizes \"" + input_sizes.name + "\" on rank " +
                                std::to_string(ranks[k]) + " are " + sizes_str(sends[k]) + ", summing to " +
                                std::to_string(total) + ", but \"" + x.name + "\" has " +
                                (local.dim() == 0 ? std::string("no dim 0 (a 0-d local)")
                                                  : std::to_string(local.size(0)) + " rows there (dim 0)"));
    }
    for (size_t k = 1; k < n; ++k) {  // rows of one shape (all_to_all_single's trailing dims)
      const at::Tensor& first = x.locals.at(static_cast<size_t>(ranks[0]));
      const at::Tensor& local = x.locals.at(static_cast<size_t>(ranks[k]));
      if (local.sizes().slice(1) != first.sizes().slice(1))
        throw SemanticError(ErrorKind::ShapeMismatch,
                            path + ": all_to_all with split sizes over \"" + mesh.axes()[axis] + "\" moves rows of one shape, but \"" +
                                x.name + "\" is " + shape_str(first.sizes().vec()) + " on rank " + std::to_string(ranks[0]) +
                                " and " + shape_str(local.sizes().vec()) + " on rank " + std::to_string(ranks[k]));
    }
    for (size_t k = 0; k < n; ++k)
      for (size_t s = 0; s < n; ++s)
        if (receives[s][k] != sends[k][s])
          throw SemanticError(ErrorKind::ShapeMismatch,
                              path + ": all_to_all over \"" + mesh.axes()[axis] + "\": rank " + std::to_string(ranks[k]) +
                                  " sends " + std::to_string(sends[k][s]) + " rows to rank " + std::to_string(ranks[s]) +
                                  " (input_split_sizes \"" + input_sizes.name + "\" " + sizes_str(sends[k]) +
                                  "), but rank " + std::to_string(ranks[s]) + " expects " +
                                  std::to_string(receives[s][k]) + " from it (output_split_sizes \"" +
                                  output_sizes.name + "\" " + sizes_str(receives[s]) + ")");
    tables.emplace_back(ranks, std::move(sends));
  }
  const Locals input = detached(x.locals);
  Locals outs = detached(move_split(tables, input, false));
  Event e = rt_.make_event("collective", "all_to_all", out, outs);
  e.axis = mesh.axes()[axis];
  e.bytes = split_bytes(tables, input);
  e.note = "split sizes";
  rt_.recorder().add(std::move(e));
  if (at::GradMode::is_enabled() && any_requires_grad(x.locals)) {
    // As collective_node's: the backward holds the Runtime and copies, never `this`.
    Runtime* rt = &rt_;
    const LocalShapes like(outs);
    const size_t n = x.locals.size();
    const std::string grad_of = x.name, axis_name = mesh.axes()[axis];
    const int program_op = rt->recorder().program_op;
    // Planted bug: the backward moves the gradient by the forward's sizes, not transposed.
    const bool transpose = !mutant_on(Mutant::AllToAllSplitBackwardUntransposed);
    connect("LTensor::all_to_all", x.locals, outs,
            [rt, like, n, grad_of, axis_name, out, tables, program_op, transpose](variable_list&& g) -> variable_list {
      ScopedOverride<int> at(rt->recorder().program_op, program_op);
      return rt->guarded(n, [&] {
        Locals grads = like.defined(std::move(g));
        Locals moved = move_split(tables, grads, transpose);
        Event b = rt->make_event("collective", "all_to_all", out, moved);
        b.axis = axis_name;
        b.bytes = split_bytes(tables, grads);
        b.note = "backward of all_to_all (split sizes transposed)";
        b.args = {grad_of};
        rt->recorder().add(std::move(b));
        return moved;
      }, out);
    });
  }
  return wrap("op", "all_to_all_split", out, std::move(outs), x.variant, x.reduced, {x, input_sizes, output_sizes}, left);
}

}  // namespace meshsim
