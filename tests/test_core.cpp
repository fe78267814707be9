// Tests of core/: placements, mesh, layout, cotangent, the redistribution planner and the cost
// model (SEMANTICS.md sections 1-3).
//
// The planner is checked by an independent symbolic executor (PlanExecutor below): it lays a
// global tensor out on a mesh by a spec straight from SEMANTICS.md, runs every step of a plan with
// its own implementation of each collective, and assembles the global value back by the target
// spec. It shares no code with the planner or with core/layout.cpp (whose local shapes it only
// compares against). Where a spec holds Partials on several axes, the global value reduces the
// outer axis first (PyTorch's full_tensor order); SEMANTICS.md leaves that order open.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cost_model.h"
#include "core/cotangent.h"
#include "core/coverage.h"
#include "core/error.h"
#include "core/layout.h"
#include "core/mesh.h"
#include "core/ops.h"
#include "core/placement.h"
#include "core/propagation.h"
#include "core/redistribute.h"

using namespace meshsim;

namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers

Placement S(int64_t d) { return Placement::shard(d); }
const Placement kR = Placement::replicate();
const Placement kRd = Placement::reduced();
const Placement kPsum = Placement::partial(ReduceOp::Sum);
const Placement kPavg = Placement::partial(ReduceOp::Avg);
const Placement kPmax = Placement::partial(ReduceOp::Max);
const Placement kPmin = Placement::partial(ReduceOp::Min);

Mesh make_mesh(const std::vector<int64_t>& shape) {
  static const char* names[] = {"a", "b", "c", "d"};
  std::vector<std::string> axes;
  for (size_t i = 0; i < shape.size(); ++i) axes.push_back(names[i]);
  return Mesh(axes, shape);
}

template <class F>
void expect_semantic_error(F&& f, ErrorKind kind, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": expected SemanticError(" << error_kind_name(kind) << ")";
  } catch (const SemanticError& e) {
    EXPECT_EQ(e.kind(), kind) << what;
    EXPECT_NE(std::string(e.what()), "") << what;
  }
}

// Every spec over `axes` mesh axes whose placements come from `pool`.
std::vector<Spec> all_specs(const std::vector<Placement>& pool, int axes) {
  std::vector<Spec> out{{}};
  for (int a = 0; a < axes; ++a) {
    std::vector<Spec> next;
    for (const auto& s : out)
      for (const auto& p : pool) {
        next.push_back(s);
        next.back().push_back(p);
      }
    out = std::move(next);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The reference model: row-major ranks and torch.chunk, written from SEMANTICS.md section 1.

struct Grid {
  std::vector<int64_t> shape;
  std::vector<std::vector<std::vector<int64_t>>> groups_;  // per axis, computed once

  explicit Grid(std::vector<int64_t> s) : shape(std::move(s)) {
    for (int a = 0; a < static_cast<int>(shape.size()); ++a) {
      groups_.emplace_back();
      for (int64_t r = 0; r < size(); ++r) {
        auto c = coords(r);
        if (c[a] != 0) continue;
        std::vector<int64_t> g;
        for (int64_t k = 0; k < shape[a]; ++k) {
          c[a] = k;
          g.push_back(rank(c));
        }
        groups_.back().push_back(g);
      }
    }
  }
  int64_t size() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  }
  std::vector<int64_t> coords(int64_t rank) const {
    std::vector<int64_t> c(shape.size());
    for (int a = static_cast<int>(shape.size()) - 1; a >= 0; --a) {
      c[a] = rank % shape[a];
      rank /= shape[a];
    }
    return c;
  }
  int64_t rank(const std::vector<int64_t>& c) const {
    int64_t r = 0;
    for (size_t a = 0; a < shape.size(); ++a) r = r * shape[a] + c[a];
    return r;
  }
  // Groups of a collective over `axis`: the ranks that differ only on `axis`, by that coordinate.
  const std::vector<std::vector<int64_t>>& groups(int axis) const { return groups_.at(axis); }
};

// torch.chunk(n, k)[r] as (offset, size): c = ceil(n/k), rows [min(n, r*c), min(n, (r+1)*c)).
std::pair<int64_t, int64_t> torch_chunk(int64_t n, int64_t k, int64_t r) {
  int64_t c = (n + k - 1) / k;
  int64_t lo = std::min(n, r * c), hi = std::min(n, (r + 1) * c);
  return {lo, hi - lo};
}

// A dense row-major tensor of doubles.
struct Dense {
  Shape shape;
  std::vector<double> v;

  static Dense zeros(const Shape& s) {
    return {s, std::vector<double>(static_cast<size_t>(
                   std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>())))};
  }
  static Dense iota(const Shape& s) {  // 1 + flat index: every element distinct
    Dense t = zeros(s);
    for (size_t i = 0; i < t.v.size(); ++i) t.v[i] = 1.0 + static_cast<double>(i);
    return t;
  }
  std::string str() const {
    std::ostringstream o;
    o << shape_str(shape) << "{";
    for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
    return o.str() + "}";
  }
};

// Copies `len` rows along dim d from src (starting at src_off) into dst (starting at dst_off);
// every other dim must agree.
void copy_rows(const Dense& src, Dense& dst, size_t d, int64_t src_off, int64_t dst_off,
               int64_t len) {
  for (size_t i = 0; i < src.shape.size(); ++i)
    if (i != d && src.shape[i] != dst.shape[i])
      throw std::logic_error("shape mismatch " + shape_str(src.shape) + " vs " +
                             shape_str(dst.shape) + " outside dim " + std::to_string(d));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= src.shape[i];
  for (size_t i = d + 1; i < src.shape.size(); ++i) inner *= src.shape[i];
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < len; ++r)
      for (int64_t j = 0; j < inner; ++j)
        dst.v[static_cast<size_t>((o * dst.shape[d] + dst_off + r) * inner + j)] =
            src.v[static_cast<size_t>((o * src.shape[d] + src_off + r) * inner + j)];
}

Dense slice(const Dense& t, size_t d, int64_t off, int64_t len) {
  Shape s = t.shape;
  s[d] = len;
  Dense out = Dense::zeros(s);
  copy_rows(t, out, d, off, 0, len);
  return out;
}

Dense chunk_piece(const Dense& t, size_t d, int64_t n, int64_t k) {
  auto [off, len] = torch_chunk(t.shape.at(d), n, k);
  return slice(t, d, off, len);
}

Dense concat(const std::vector<Dense>& parts, size_t d) {
  Shape s = parts.at(0).shape;
  s[d] = 0;
  for (const auto& p : parts) s[d] += p.shape.at(d);
  Dense out = Dense::zeros(s);
  int64_t off = 0;
  for (const auto& p : parts) {
    copy_rows(p, out, d, 0, off, p.shape[d]);
    off += p.shape[d];
  }
  return out;
}

Dense reduce(const std::vector<Dense>& parts, ReduceOp op) {
  Dense out = parts.at(0);
  for (size_t k = 1; k < parts.size(); ++k) {
    if (parts[k].shape != out.shape)
      throw std::logic_error("reduce over locals of shapes " + shape_str(out.shape) + " and " +
                             shape_str(parts[k].shape));
    for (size_t i = 0; i < out.v.size(); ++i) {
      double x = parts[k].v[i];
      double& y = out.v[i];
      y = op == ReduceOp::Max ? std::max(x, y) : op == ReduceOp::Min ? std::min(x, y) : x + y;
    }
  }
  if (op == ReduceOp::Avg)
    for (double& y : out.v) y /= static_cast<double>(parts.size());
  return out;
}

// Exact, except that dividing by a group of 3 (R -> P(sum) by division, P(avg)) is not exact in
// binary floating point: allow a relative 1e-12.
bool same(const Dense& a, const Dense& b) {
  if (a.shape != b.shape) return false;
  for (size_t i = 0; i < a.v.size(); ++i)
    if (std::abs(a.v[i] - b.v[i]) > 1e-12 * std::max(1.0, std::abs(b.v[i]))) return false;
  return true;
}

// Splits the value t over a group of n ranks as Partial(op): a deterministic, uneven split.
// For every element one member balances the others; which one, and the small integers the others
// hold, vary with the element and with `salt` (the group), so that no two groups split alike.
std::vector<Dense> split_partial(const Dense& t, ReduceOp op, int64_t n, int64_t salt) {
  std::vector<Dense> out(static_cast<size_t>(n), t);
  for (size_t i = 0; i < t.v.size(); ++i) {
    const int64_t mix = static_cast<int64_t>(i) + salt;
    const int64_t owner = mix % n;
    double rest = 0;
    for (int64_t k = 0; k < n; ++k) {
      if (k == owner) continue;
      double e = 1.0 + static_cast<double>((k + 2 * mix) % 3);
      double& x = out[static_cast<size_t>(k)].v[i];
      switch (op) {
        case ReduceOp::Sum: x = e; rest += e; break;
        case ReduceOp::Avg: x = t.v[i] + e; rest += e; break;
        case ReduceOp::Max: x = t.v[i] - e; break;
        case ReduceOp::Min: x = t.v[i] + e; break;
        case ReduceOp::Norm: throw std::logic_error("split_partial: a norm's partial is not split here");
      }
    }
    out[static_cast<size_t>(owner)].v[i] = t.v[i] - rest;
  }
  return out;
}

using Locals = std::vector<Dense>;  // indexed by rank

// The order in which assembling a spec reduces its Partial axes. SEMANTICS.md leaves it open; it
// matters only when two axes hold Partials whose ops do not commute (max with sum, max with min).
// OuterFirst is PyTorch's (full_tensor reduces mesh dim 0 first) and the planner's phase B order.
enum class PartialOrder { OuterFirst, InnerFirst };

// The Partial axes of `spec`, in the order assembling reduces them.
std::vector<int> partial_axes(const Spec& spec, PartialOrder order) {
  std::vector<int> out;
  for (int a = 0; a < static_cast<int>(spec.size()); ++a)
    if (spec[a].is_partial()) out.push_back(a);
  if (order == PartialOrder::InnerFirst) std::reverse(out.begin(), out.end());
  return out;
}

// Lays `global` out by `spec`: first splits the value over the Partial axes (the axis reduced
// last is split first), then takes every rank's nested torch.chunk piece, outer Shard axis first.
// R and Rd keep the value.
Locals build_locals(const Grid& g, const Spec& spec, const Dense& global,
                    PartialOrder order = PartialOrder::OuterFirst) {
  Locals locals(static_cast<size_t>(g.size()), global);
  auto partials = partial_axes(spec, order);
  std::reverse(partials.begin(), partials.end());
  std::vector<int> done;
  for (int a : partials) {
    for (const auto& group : g.groups(a)) {
      // The members differ only on axis a, not yet split: they hold the same value. The salt
      // depends only on the axes already split, so that every axis a group splits alike.
      int64_t salt = 0;
      for (int b : done) salt = salt * g.shape[b] + g.coords(group[0])[b];
      auto parts = split_partial(locals[group[0]], spec[a].op, g.shape[a], salt);
      for (size_t k = 0; k < group.size(); ++k) locals[group[k]] = parts[k];
    }
    done.push_back(a);
  }
  for (int a = 0; a < static_cast<int>(spec.size()); ++a) {
    if (!spec[a].is_shard()) continue;
    for (const auto& group : g.groups(a))
      for (size_t k = 0; k < group.size(); ++k)
        locals[group[k]] = chunk_piece(locals[group[k]], spec[a].dim, g.shape[a], k);
  }
  return locals;
}

// The inverse of build_locals: combines the Shard and R/Rd axes innermost first (concat for
// Shard; for R/Rd checks that the group agrees), then reduces the Partial axes in `order`.
// Throws std::logic_error when the locals are not a valid layout for `spec`.
Dense assemble(const Grid& g, const Spec& spec, Locals locals,
               PartialOrder order = PartialOrder::OuterFirst) {
  std::vector<int> axes;
  for (int a = static_cast<int>(spec.size()) - 1; a >= 0; --a)
    if (!spec[a].is_partial()) axes.push_back(a);
  for (int a : partial_axes(spec, order)) axes.push_back(a);
  for (int a : axes) {
    const Placement& p = spec[a];
    for (const auto& group : g.groups(a)) {
      std::vector<Dense> parts;
      for (auto r : group) parts.push_back(locals[r]);
      Dense combined;
      if (p.is_shard()) {
        combined = concat(parts, p.dim);
      } else if (p.is_partial()) {
        combined = reduce(parts, p.op);
      } else {
        for (const auto& q : parts)
          if (!same(q, parts[0]))
            throw std::logic_error("replicated axis " + std::to_string(a) + " disagrees: " +
                                   q.str() + " vs " + parts[0].str());
        combined = parts[0];
      }
      for (auto r : group) locals[r] = combined;
    }
  }
  return locals.at(0);
}

// ---------------------------------------------------------------------------------------------
// The symbolic executor: runs each RedistStep on the per-rank locals.

struct PlanExecutor {
  Grid grid;
  Locals locals;
  Spec cur;

  void run(const RedistStep& s) {
    if (s.axis < 0 || s.axis >= static_cast<int>(cur.size()))
      throw std::logic_error("step on axis " + std::to_string(s.axis) + " out of range");
    if (s.from != cur[s.axis])
      throw std::logic_error("step from " + s.from.str() + " but the axis is " +
                             cur[s.axis].str());
    const int64_t n = grid.shape[s.axis];
    for (const auto& group : grid.groups(s.axis)) {
      std::vector<Dense> in;
      for (auto r : group) in.push_back(locals[r]);
      std::vector<Dense> out = apply(s, in, n);
      for (int64_t k = 0; k < n; ++k) locals[group[k]] = out[k];
    }
    cur[s.axis] = s.to;
  }

  // One group's locals (in coordinate order) in, the same group's locals out.
  static std::vector<Dense> apply(const RedistStep& s, const std::vector<Dense>& in, int64_t n) {
    std::vector<Dense> out;
    switch (s.kind) {
      case StepKind::AllGather:
        out.assign(n, concat(in, s.dim));
        break;
      case StepKind::AllReduce:
        out.assign(n, reduce(in, s.op));
        break;
      case StepKind::ReduceScatter: {
        Dense full = reduce(in, s.op);
        for (int64_t k = 0; k < n; ++k) out.push_back(chunk_piece(full, s.dim, n, k));
        break;
      }
      case StepKind::AllToAll:
        for (int64_t k = 0; k < n; ++k) {  // receiver k gets piece k of every sender, in order
          std::vector<Dense> received;
          for (int64_t m = 0; m < n; ++m) received.push_back(chunk_piece(in[m], s.split_dim, n, k));
          out.push_back(concat(received, s.concat_dim));
        }
        break;
      case StepKind::LocalChunk:
        for (int64_t k = 0; k < n; ++k) out.push_back(chunk_piece(in[k], s.dim, n, k));
        break;
      case StepKind::PartialFromReplicate:
        out = in;
        if (s.op == ReduceOp::Sum)
          for (int64_t k = 0; k < n; ++k)
            for (double& x : out[k].v)
              x = s.convention == PartialFromReplicate::Divide ? x / static_cast<double>(n)
                                                                : (k == 0 ? x : 0.0);
        break;
      case StepKind::PadToPartial: {
        int64_t extent = 0;
        for (const auto& t : in) extent += t.shape.at(s.dim);
        int64_t off = 0;
        for (int64_t k = 0; k < n; ++k) {
          Shape shape = in[k].shape;
          shape[s.dim] = extent;
          Dense z = Dense::zeros(shape);
          copy_rows(in[k], z, s.dim, 0, off, in[k].shape[s.dim]);
          off += in[k].shape[s.dim];
          out.push_back(std::move(z));
        }
        break;
      }
      case StepKind::RescalePartial:  // P(avg) <-> P(sum): each local times n or 1/n
        out = in;
        for (auto& t : out)
          for (double& x : t.v)
            x = s.op == ReduceOp::Avg ? x / static_cast<double>(n) : x * static_cast<double>(n);
        break;
      case StepKind::Relabel:
        out = in;
        break;
    }
    return out;
  }
};

std::string plan_str(const std::vector<RedistStep>& plan) {
  std::string out;
  for (const auto& s : plan) out += "\n    " + s.str();
  return out.empty() ? "\n    (empty plan)" : out;
}

bool same_step(const RedistStep& x, const RedistStep& y) {
  return x.kind == y.kind && x.axis == y.axis && x.from == y.from && x.to == y.to &&
         x.dim == y.dim && x.split_dim == y.split_dim && x.concat_dim == y.concat_dim &&
         x.op == y.op && x.convention == y.convention;
}

bool same_plan(const std::vector<RedistStep>& x, const std::vector<RedistStep>& y) {
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin(), same_step);
}

bool has_pfr_sum(const std::vector<RedistStep>& plan) {
  return std::any_of(plan.begin(), plan.end(), [](const RedistStep& s) {
    return s.kind == StepKind::PartialFromReplicate && s.op == ReduceOp::Sum;
  });
}

// SEMANTICS.md section 3: only S -> P and P(a) -> P(b) are illegal (S -> P(sum), P(sum) -> P(avg)
// and P(avg) -> P(sum) are legal for gradients).
bool sum_or_avg(const Placement& p) { return p.op == ReduceOp::Sum || p.op == ReduceOp::Avg; }
bool expect_legal(const Spec& from, const Spec& to, bool gradient) {
  for (size_t a = 0; a < from.size(); ++a) {
    const Placement &f = from[a], &t = to[a];
    if (!t.is_partial() || f == t) continue;
    if (f.is_partial()) {
      if (gradient && sum_or_avg(f) && sum_or_avg(t)) continue;
      return false;
    }
    if (f.is_shard() && !(gradient && t.op == ReduceOp::Sum)) return false;
  }
  return true;
}

// Runs `plan` on `global` laid out by `from` and checks everything; returns "" or what failed.
std::string check_plan(const Mesh& mesh, const Spec& from, const Spec& to, const Dense& global,
                       const std::vector<RedistStep>& plan) {
  PlanExecutor ex{Grid{mesh.shape()}, {}, from};
  try {
    ex.locals = build_locals(ex.grid, from, global);
    for (size_t i = 0; i < plan.size(); ++i) {
      const RedistStep& s = plan[i];
      const std::string at = "step " + std::to_string(i) + " (" + s.str() + "): ";
      if (s.axis >= 0 && s.axis < mesh.ndim() && mesh.axis_size(s.axis) == 1 &&
          s.kind != StepKind::Relabel)
        return at + "a step over an axis of size 1 must be a relabel";
      ex.run(s);
      // Every intermediate state is a valid layout of the same global value.
      if (!same(assemble(ex.grid, ex.cur, ex.locals), global))
        return at + "the intermediate state " + spec_str(ex.cur) + " no longer assembles";
    }
    if (ex.cur != to) return "the plan ends at " + spec_str(ex.cur);
    // No detours: a step changes its axis; an axis takes at most two steps and one collective.
    for (int a = 0; a < mesh.ndim(); ++a) {
      int steps = 0, collectives = 0;
      for (const auto& s : plan)
        if (s.axis == a) {
          if (s.from == s.to) return "a step that changes nothing: " + s.str();
          ++steps;
          collectives += s.communicates();
        }
      if (steps > 2 || collectives > 1) return "a detour on axis " + std::to_string(a);
    }
    for (int64_t r = 0; r < mesh.size(); ++r)
      if (ex.locals[r].shape != local_layout(mesh, to, global.shape, r).shape)
        return "rank " + std::to_string(r) + " ends with shape " + shape_str(ex.locals[r].shape) +
               ", local_layout says " + shape_str(local_layout(mesh, to, global.shape, r).shape);
    Dense result = assemble(ex.grid, to, ex.locals);
    if (!same(result, global)) return "assembles " + result.str() + ", expected " + global.str();
    if (std::none_of(to.begin(), to.end(), [](const Placement& p) { return p.is_partial(); })) {
      Locals expected = build_locals(ex.grid, to, global);
      for (int64_t r = 0; r < mesh.size(); ++r)
        if (!same(ex.locals[r], expected[r]))
          return "rank " + std::to_string(r) + " holds " + ex.locals[r].str() + ", expected " +
                 expected[r].str();
    }
  } catch (const std::exception& e) {
    return std::string("executor: ") + e.what();
  }
  return {};
}

// The exhaustive sweep: every ordered pair of specs, under every option that can matter.
struct Sweep {
  int64_t pairs = 0;     // (mesh, shape, from, to) checked
  int64_t legal = 0;     // of which legal without the gradient option
  int64_t executed = 0;  // plans run and assembled (divide, rank0 and gradient plans)
  int64_t rejected = 0;  // (pair, options) that threw IllegalRedistribute as they must
  int64_t failures = 0;

  struct Case {
    const Mesh& mesh;
    const Shape& shape;
    const Spec& from;
    const Spec& to;
  };

  void fail(const Case& c, const std::string& options, const std::string& why,
            const std::vector<RedistStep>& plan = {}) {
    if (++failures > 25) return;  // keep the log readable
    ADD_FAILURE() << "mesh " << c.mesh.str() << ", shape " << shape_str(c.shape) << ", "
                  << spec_str(c.from) << " -> " << spec_str(c.to) << " (" << options
                  << "): " << why << "\n  plan:" << plan_str(plan);
  }

  // Plans a legal pair; a throw is a failure (and an empty plan, which the executor rejects
  // unless from == to).
  std::vector<RedistStep> plan(const Case& c, const PlanOptions& o, const std::string& name) {
    try {
      return plan_redistribute(c.mesh, c.from, c.to, o);
    } catch (const std::exception& e) {
      fail(c, name, std::string("a legal pair threw: ") + e.what());
      return {};
    }
  }

  void execute(const Case& c, const std::vector<RedistStep>& plan, const std::string& name) {
    ++executed;
    std::string why = check_plan(c.mesh, c.from, c.to, Dense::iota(c.shape), plan);
    if (!why.empty()) fail(c, name, why, plan);
  }

  void expect_illegal(const Case& c, const PlanOptions& o, const std::string& name) {
    try {
      fail(c, name, "an illegal pair planned", plan_redistribute(c.mesh, c.from, c.to, o));
    } catch (const SemanticError& e) {
      if (e.kind() != ErrorKind::IllegalRedistribute)
        fail(c, name, std::string("wrong error kind ") + error_kind_name(e.kind()));
      ++rejected;
    }
  }

  void pair(const Case& c) {
    const PlanOptions divide{PartialFromReplicate::Divide, false};
    const PlanOptions rank0{PartialFromReplicate::Rank0, false};
    const PlanOptions grad_divide{PartialFromReplicate::Divide, true};
    const PlanOptions grad_rank0{PartialFromReplicate::Rank0, true};
    ++pairs;
    if (expect_legal(c.from, c.to, false)) {
      ++legal;
      auto p = plan(c, divide, "divide");
      if (!same_plan(p, plan(c, divide, "divide")))
        fail(c, "divide", "the planner is not deterministic", p);
      execute(c, p, "divide");
      // Rank0 changes only the convention of R -> P(sum): run it where that step occurs.
      auto p0 = plan(c, rank0, "rank0");
      for (const auto& s : p0)
        if (s.kind == StepKind::PartialFromReplicate && s.convention != PartialFromReplicate::Rank0)
          fail(c, "rank0", "the option did not reach " + s.str(), p0);
      if (has_pfr_sum(p0)) execute(c, p0, "rank0");
      // The gradient option changes nothing for a pair that is legal without it.
      if (!same_plan(p, plan(c, grad_divide, "gradient")))
        fail(c, "gradient", "gradient=true changed a legal plan", p);
      return;
    }
    expect_illegal(c, divide, "divide");
    expect_illegal(c, rank0, "rank0");
    if (!expect_legal(c.from, c.to, true)) {
      expect_illegal(c, grad_divide, "gradient");
      return;
    }
    execute(c, plan(c, grad_divide, "gradient, divide"), "gradient, divide");  // S -> P(sum)
    auto p0 = plan(c, grad_rank0, "gradient, rank0");
    if (has_pfr_sum(p0)) execute(c, p0, "gradient, rank0");
  }

  void all_pairs(const Mesh& mesh, const std::vector<Shape>& shapes,
                 const std::vector<Spec>& specs) {
    for (const auto& shape : shapes)
      for (const auto& from : specs)
        for (const auto& to : specs) pair({mesh, shape, from, to});
  }

  void report(const char* name) const {
    for (const auto& [key, value] : {std::pair{"pairs", pairs}, {"legal_pairs", legal},
                                     {"executed_plans", executed}, {"rejected", rejected}})
      ::testing::Test::RecordProperty(key, std::to_string(value));
    std::printf("[ %-9s] %s: %lld (mesh, shape, from, to) pairs, %lld legal; %lld plans executed "
                "and assembled exactly; %lld illegal (pair, options) rejected\n",
                "COUNT", name, static_cast<long long>(pairs), static_cast<long long>(legal),
                static_cast<long long>(executed), static_cast<long long>(rejected));
    EXPECT_EQ(failures, 0);
  }
};

const std::vector<Shape> kPlannerShapes = {{5, 3}, {4, 6}, {0, 3}, {7, 2}};

}  // namespace

// =============================================================================================
// 1. Placements

TEST(Placement, CanonicalAndPytorchSpellingsRoundTrip) {
  struct Case {
    Placement p;
    const char* canonical;
    const char* pytorch;
  };
  const std::vector<Case> cases = {
      {S(0), "S(0)", "Shard(dim=0)"},      {S(1), "S(1)", "Shard(dim=1)"},
      {S(12), "S(12)", "Shard(dim=12)"},   {kR, "R", "Replicate()"},
      {kPsum, "P(sum)", "Partial(sum)"},   {kPavg, "P(avg)", "Partial(avg)"},
      {kPmax, "P(max)", "Partial(max)"},   {kPmin, "P(min)", "Partial(min)"},
      {kRd, "Rd", "Reduced()"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(c.p.str(), c.canonical);
    EXPECT_EQ(c.p.pytorch_str(), c.pytorch);
    EXPECT_EQ(parse_placement(c.p.str()), c.p) << c.canonical;
    EXPECT_EQ(parse_placement(c.p.pytorch_str()), c.p) << c.pytorch;
  }
  for (const auto& p : all_placements(3)) {
    EXPECT_EQ(parse_placement(p.str()), p);
    EXPECT_EQ(parse_placement(p.pytorch_str()), p);
  }
}

TEST(Placement, PytorchInputSpellings) {
  EXPECT_EQ(parse_placement("Shard(0)"), S(0));
  EXPECT_EQ(parse_placement("Shard(3)"), S(3));
  EXPECT_EQ(parse_placement("Shard(dim=2)"), S(2));
  EXPECT_EQ(parse_placement("Partial()"), kPsum);
  EXPECT_EQ(parse_placement("Partial(sum)"), kPsum);
  EXPECT_EQ(parse_placement("Partial(reduce_op=max)"), kPmax);
  EXPECT_EQ(parse_placement("Replicate()"), kR);
  EXPECT_EQ(parse_placement("Reduced()"), kRd);
  EXPECT_EQ(parse_placement("  S(1) "), S(1));
}

TEST(Placement, MalformedStringsThrowWithAMessage) {
  for (const char* bad : {"S", "S(x)", "P()", "Q", "Shard(dim=)", "P(mul)", "", "S(", "R(1)",
                          "Replicate", "Rd(0)", "Shard(foo=1)", "S(-65)"}) {
    try {
      parse_placement(bad);
      ADD_FAILURE() << "\"" << bad << "\" parsed";
    } catch (const std::invalid_argument& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("\"") + bad + "\""), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(parse_reduce_op("mul"), std::invalid_argument);
}

TEST(Placement, PredicatesAndEquality) {
  EXPECT_TRUE(kRd.is_replicate());
  EXPECT_TRUE(kRd.is_reduced());
  EXPECT_FALSE(kRd.is_plain_replicate());
  EXPECT_TRUE(kR.is_replicate());
  EXPECT_TRUE(kR.is_plain_replicate());
  EXPECT_FALSE(kR.is_reduced());
  EXPECT_NE(kR, kRd);
  EXPECT_NE(S(0), S(1));
  EXPECT_NE(kPsum, kPavg);
  for (const auto& p : all_placements(2)) {
    EXPECT_FALSE(p.is_shard() && p.is_replicate());
    EXPECT_FALSE(p.is_partial() && p.is_replicate());
  }
  EXPECT_EQ(spec_str({S(0), kRd}), "[S(0), Rd]");
  const std::vector<Placement> expected = {S(0), S(1), kR, kPsum, kPavg, kPmax, kPmin, kRd};
  EXPECT_EQ(all_placements(2), expected);
}

// =============================================================================================
// 2. Mesh

TEST(Mesh, RowMajorRanksAndCoordsRoundTrip) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {1}, {4}, {2, 3}, {3, 2}, {1, 4}, {2, 1, 3}, {2, 3, 2}}) {
    Mesh mesh = make_mesh(shape);
    Grid grid{shape};
    ASSERT_EQ(mesh.size(), grid.size());
    for (int64_t r = 0; r < mesh.size(); ++r) {
      EXPECT_EQ(mesh.coords(r), grid.coords(r));
      EXPECT_EQ(mesh.rank_of(mesh.coords(r)), r);
      for (int a = 0; a < mesh.ndim(); ++a) EXPECT_EQ(mesh.coord(r, a), grid.coords(r)[a]);
    }
    for (int a = 0; a < mesh.ndim(); ++a) EXPECT_EQ(mesh.groups(a), grid.groups(a)) << mesh.str();
  }
  Mesh m({"dp", "tp"}, {2, 4});
  EXPECT_EQ(m.coords(5), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(m.rank_of({1, 3}), 7);
  EXPECT_EQ(m.axis_index("tp"), 1);
  EXPECT_EQ(m.axis_index("pp"), -1);
  EXPECT_EQ(m.str(), "dp=2 x tp=4");
}

TEST(Mesh, Groups) {
  using G = std::vector<std::vector<int64_t>>;
  Mesh m1({"x"}, {4});
  EXPECT_EQ(m1.groups(0), (G{{0, 1, 2, 3}}));
  Mesh m2({"dp", "tp"}, {2, 3});
  EXPECT_EQ(m2.groups(0), (G{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_EQ(m2.groups(1), (G{{0, 1, 2}, {3, 4, 5}}));
  Mesh m3({"a", "b", "c"}, {2, 2, 2});
  EXPECT_EQ(m3.groups(0), (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m3.groups(1), (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m3.groups(2), (G{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  Mesh m4({"a", "b"}, {3, 1});
  EXPECT_EQ(m4.groups(1), (G{{0}, {1}, {2}}));
}

TEST(Mesh, BadMeshesThrow) {
  EXPECT_THROW(Mesh({}, {}), std::invalid_argument);
  EXPECT_THROW(Mesh({"a"}, {0}), std::invalid_argument);
  EXPECT_THROW(Mesh({"a", "b"}, {2, -1}), std::invalid_argument);
  EXPECT_THROW(Mesh({"a", "a"}, {2, 2}), std::invalid_argument);
  EXPECT_THROW(Mesh({""}, {2}), std::invalid_argument);
  EXPECT_THROW(Mesh({"a", "b"}, {2}), std::invalid_argument);
}

// =============================================================================================
// 3. Layout

TEST(Layout, TorchChunkSemantics) {
  auto sizes = [](int64_t n, int64_t k) {
    std::vector<int64_t> out;
    int64_t next = 0;
    for (int64_t r = 0; r < k; ++r) {
      Chunk c = chunk_of(n, k, r);
      EXPECT_EQ(c.offset, std::min(next, n)) << n << " over " << k;
      next = c.offset + c.size;
      out.push_back(c.size);
    }
    EXPECT_EQ(next, n);
    return out;
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(sizes(13, 4), (V{4, 4, 4, 1}));
  EXPECT_EQ(sizes(5, 4), (V{2, 2, 1, 0}));
  EXPECT_EQ(sizes(6, 4), (V{2, 2, 2, 0}));
  EXPECT_EQ(sizes(8, 4), (V{2, 2, 2, 2}));
  EXPECT_EQ(sizes(0, 3), (V{0, 0, 0}));
  EXPECT_EQ(sizes(1, 3), (V{1, 0, 0}));
  EXPECT_EQ(sizes(7, 1), (V{7}));
  EXPECT_EQ(padded_chunk(13, 4), 4);
  EXPECT_EQ(padded_chunk(5, 4), 2);
  EXPECT_EQ(padded_chunk(0, 4), 0);
  for (int64_t n = 0; n <= 12; ++n)
    for (int64_t k = 1; k <= 5; ++k)
      for (int64_t r = 0; r < k; ++r) {
        auto [off, len] = torch_chunk(n, k, r);
        EXPECT_EQ(chunk_of(n, k, r).offset, off);
        EXPECT_EQ(chunk_of(n, k, r).size, len);
      }
}

TEST(Layout, NestedShardingOuterAxisFirst) {
  // 13 rows over dp=2 then tp=2: dp chunks 7 and 6, then tp splits each: 4,3 and 3,3.
  Mesh mesh({"dp", "tp"}, {2, 2});
  const Spec spec = {S(0), S(0)};
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 4}, {4, 3}, {7, 3}, {10, 3}};
  for (int64_t r = 0; r < 4; ++r) {
    LocalLayout l = local_layout(mesh, spec, {13, 2}, r);
    EXPECT_EQ(l.offset, (Shape{expected[r].first, 0})) << r;
    EXPECT_EQ(l.shape, (Shape{expected[r].second, 2})) << r;
  }
  LocalLayout l = local_layout(mesh, {S(1), S(0)}, {5, 6}, 3);
  EXPECT_EQ(l.offset, (Shape{3, 3}));
  EXPECT_EQ(l.shape, (Shape{2, 3}));
  l = local_layout(mesh, {kPsum, kRd}, {5, 6}, 3);
  EXPECT_EQ(l.offset, (Shape{0, 0}));
  EXPECT_EQ(l.shape, (Shape{5, 6}));
}

TEST(Layout, LocalPiecesTileTheGlobalTensor) {
  // For every spec, fix the coordinates of the non-Shard axes (a replica group): the ranks that
  // vary the Shard axes cover every element exactly once.
  int64_t checked = 0;
  for (const auto& shape : std::vector<Shape>{{5, 3}, {0, 2}, {7}, {1, 6}, {4, 6}})
    for (const auto& mshape : std::vector<std::vector<int64_t>>{
             {1}, {2}, {3}, {4}, {1, 1}, {1, 2}, {2, 2}, {2, 3}, {3, 4}, {4, 4}, {4, 1}, {3, 3}}) {
      Mesh mesh = make_mesh(mshape);
      Grid grid{mshape};
      for (const auto& spec : all_specs(all_placements(static_cast<int64_t>(shape.size())),
                                        mesh.ndim())) {
        ASSERT_EQ(check_spec(mesh, spec, static_cast<int64_t>(shape.size())), "");
        std::map<std::vector<int64_t>, std::vector<int>> cover;  // replica key -> hit counts
        for (int64_t r = 0; r < mesh.size(); ++r) {
          LocalLayout l = local_layout(mesh, spec, shape, r);
          std::vector<int64_t> key = grid.coords(r);
          for (size_t a = 0; a < spec.size(); ++a)
            if (spec[a].is_shard()) key[a] = -1;
          auto& hits = cover[key];
          hits.resize(static_cast<size_t>(numel(shape)));
          ASSERT_EQ(l.shape.size(), shape.size());
          std::vector<int64_t> idx(shape.size(), 0);
          for (int64_t i = 0; i < numel(l.shape); ++i) {  // every local element -> global index
            int64_t rem = i, flat = 0;
            for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
              idx[d] = l.offset[d] + rem % l.shape[d];
              rem /= l.shape[d];
            }
            for (size_t d = 0; d < shape.size(); ++d) {
              ASSERT_LT(idx[d], shape[d]);
              flat = flat * shape[d] + idx[d];
            }
            ++hits[static_cast<size_t>(flat)];
          }
        }
        for (const auto& [key, hits] : cover)
          for (int h : hits)
            ASSERT_EQ(h, 1) << mesh.str() << " " << spec_str(spec) << " " << shape_str(shape);
        ++checked;
      }
    }
  std::printf("[ %-9s] %lld (mesh, spec, shape) layouts tile exactly\n", "COUNT",
              static_cast<long long>(checked));
}

TEST(Layout, CheckSpecAndHelpers) {
  Mesh mesh({"dp", "tp"}, {2, 2});
  EXPECT_EQ(check_spec(mesh, {S(0), kR}, 2), "");
  EXPECT_NE(check_spec(mesh, {S(0)}, 2), "");
  EXPECT_NE(check_spec(mesh, {S(2), kR}, 2), "");
  EXPECT_EQ(numel({}), 1);
  EXPECT_EQ(numel({3, 0}), 0);
  EXPECT_EQ(numel({3, 4}), 12);
  EXPECT_EQ(shape_str({8, 16}), "[8, 16]");
}

// =============================================================================================
// 4. Cotangent

TEST(Cotangent, Table) {
  auto check = [](const Placement& p, const Placement& want, bool scaled) {
    Cotangent c = cotangent(p);
    EXPECT_EQ(c.placement, want) << p.str();
    EXPECT_EQ(c.scaled_by_inverse_group, scaled) << p.str();
  };
  check(S(0), S(0), false);
  check(S(1), S(1), false);
  check(kR, kR, false);
  check(kPsum, kRd, false);
  check(kRd, kPsum, false);
  check(kPavg, kRd, true);
  for (const auto& p : {kPmax, kPmin})
    expect_semantic_error([&] { cotangent(p); }, ErrorKind::NotDifferentiable, p.str());
  EXPECT_EQ(cotangent_spec({S(0), kPsum, kRd}), (Spec{S(0), kRd, kPsum}));
  expect_semantic_error([] { cotangent_spec({kR, kPmax}); }, ErrorKind::NotDifferentiable,
                        "cotangent_spec");
}

TEST(Cotangent, InvolutionOnShardReplicatePartialSumReduced) {
  for (const auto& p : {S(0), S(1), S(2), kR, kPsum, kRd})
    EXPECT_EQ(cotangent(cotangent(p).placement).placement, p) << p.str();
  // P(avg) is not: its cotangent Rd maps back to P(sum).
  EXPECT_EQ(cotangent(cotangent(kPavg).placement).placement, kPsum);
}

TEST(Cotangent, ScaleDivisor) {
  Mesh mesh({"dp", "tp"}, {2, 3});
  EXPECT_EQ(cotangent_scale_divisor(mesh, {kPavg, kPavg}), 6);
  EXPECT_EQ(cotangent_scale_divisor(mesh, {kPavg, kR}), 2);
  EXPECT_EQ(cotangent_scale_divisor(mesh, {S(0), kPavg}), 3);
  EXPECT_EQ(cotangent_scale_divisor(mesh, {kPsum, kRd}), 1);
  EXPECT_EQ(cotangent_scale_divisor(mesh, {S(0), S(1)}), 1);
  expect_semantic_error([&] { cotangent_scale_divisor(mesh, {kPmin, kR}); },
                        ErrorKind::NotDifferentiable, "divisor of P(min)");
}

// =============================================================================================
// 5. The planner

// The executor itself, on hand-computed cases, so that a bug in it cannot hide a planner bug.
TEST(Executor, ReferenceModel) {
  Grid grid({2});
  Dense g = Dense::iota({3, 2});  // rows {1,2},{3,4},{5,6}
  Locals shard = build_locals(grid, {S(0)}, g);
  EXPECT_EQ(shard[0].v, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(shard[1].v, (std::vector<double>{5, 6}));
  Locals col = build_locals(grid, {S(1)}, g);
  EXPECT_EQ(col[0].v, (std::vector<double>{1, 3, 5}));
  EXPECT_EQ(col[1].v, (std::vector<double>{2, 4, 6}));
  for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    Locals p = build_locals(grid, {Placement::partial(op)}, g);
    EXPECT_FALSE(same(p[0], g) && same(p[1], g)) << reduce_op_name(op);
    EXPECT_TRUE(same(reduce(p, op), g)) << reduce_op_name(op);
    EXPECT_TRUE(same(assemble(grid, {Placement::partial(op)}, p), g));
  }
  EXPECT_THROW(assemble(grid, {kR}, shard), std::logic_error);
  // A Partial split reduced by the wrong op does not give the value back.
  Locals p3 = build_locals(Grid({3}), {kPsum}, Dense::iota({4}));
  EXPECT_FALSE(same(reduce(p3, ReduceOp::Max), Dense::iota({4})));
  EXPECT_FALSE(same(reduce(p3, ReduceOp::Avg), Dense::iota({4})));
  // all_to_all S(0) -> S(1) over 2 ranks on the 3x2 tensor.
  RedistStep a2a;
  a2a.kind = StepKind::AllToAll;
  a2a.from = S(0);
  a2a.to = S(1);
  a2a.split_dim = 1;
  a2a.concat_dim = 0;
  PlanExecutor ex{grid, shard, {S(0)}};
  ex.run(a2a);
  EXPECT_EQ(ex.locals[0].v, (std::vector<double>{1, 3, 5}));
  EXPECT_EQ(ex.locals[1].v, (std::vector<double>{2, 4, 6}));
  // pad_to_partial S(0) -> P(sum).
  RedistStep pad;
  pad.kind = StepKind::PadToPartial;
  pad.from = S(0);
  pad.to = kPsum;
  PlanExecutor ex2{grid, shard, {S(0)}};
  ex2.run(pad);
  EXPECT_EQ(ex2.locals[0].v, (std::vector<double>{1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(ex2.locals[1].v, (std::vector<double>{0, 0, 0, 0, 5, 6}));
  // reduce_scatter P(sum) -> S(0): the sum, then the rank's torch.chunk rows (2 and 1).
  RedistStep rs;
  rs.kind = StepKind::ReduceScatter;
  rs.from = kPsum;
  rs.to = S(0);
  PlanExecutor ex3{grid, build_locals(grid, {kPsum}, g), {kPsum}};
  ex3.run(rs);
  EXPECT_EQ(ex3.locals[0].v, (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(ex3.locals[1].v, (std::vector<double>{5, 6}));
  // A wrong plan is caught: a relabel where an all_gather belongs.
  RedistStep wrong;
  wrong.kind = StepKind::Relabel;
  wrong.from = S(0);
  wrong.to = kR;
  Mesh mesh({"x"}, {2});
  EXPECT_NE(check_plan(mesh, {S(0)}, {kR}, g, {wrong}), "");
}

// SEMANTICS.md does not say in which order the Partial axes of a spec reduce; the order matters
// only when their ops do not commute. The executor (and the planner) reduce the outer axis first.
TEST(Executor, PartialOrderMattersOnlyForNonCommutingOps) {
  Grid grid({2, 3});
  const Dense g = Dense::iota({4});
  for (const auto& spec : std::vector<Spec>{{kPmax, kPsum}, {kPsum, kPmin}, {kPmin, kPmax}}) {
    Locals l = build_locals(grid, spec, g, PartialOrder::OuterFirst);
    EXPECT_TRUE(same(assemble(grid, spec, l, PartialOrder::OuterFirst), g)) << spec_str(spec);
    EXPECT_FALSE(same(assemble(grid, spec, l, PartialOrder::InnerFirst), g)) << spec_str(spec);
  }
  for (const auto& spec : std::vector<Spec>{{kPavg, kPsum}, {kPmax, kPmax}, {kPmin, S(0)}}) {
    Locals l = build_locals(grid, spec, g, PartialOrder::OuterFirst);
    EXPECT_TRUE(same(assemble(grid, spec, l, PartialOrder::InnerFirst), g)) << spec_str(spec);
  }
}

TEST(Planner, ExhaustiveOneAxisMeshes) {
  Sweep sweep;
  for (int64_t n = 1; n <= 4; ++n)
    sweep.all_pairs(make_mesh({n}), kPlannerShapes, all_specs(all_placements(2), 1));
  // 1-D tensors too, with every placement of them.
  for (int64_t n = 1; n <= 4; ++n)
    sweep.all_pairs(make_mesh({n}), {{7}, {2}, {0}}, all_specs(all_placements(1), 1));
  sweep.report("1-axis meshes");
}

TEST(Planner, ExhaustiveTwoAxisMeshes) {
  Sweep sweep;
  const auto specs = all_specs(all_placements(2), 2);
  for (int64_t n0 = 1; n0 <= 4; ++n0)
    for (int64_t n1 = 1; n1 <= 4; ++n1) sweep.all_pairs(make_mesh({n0, n1}), kPlannerShapes, specs);
  sweep.report("2-axis meshes");
}

TEST(Planner, SampledThreeAxisMesh) {
  // Three axes sharding the same dim nest three deep; a sample of placements keeps this quick.
  Sweep sweep;
  const auto specs = all_specs({S(0), S(1), kPsum, kPmax, kRd}, 3);
  sweep.all_pairs(make_mesh({2, 3, 2}), {{7, 5}}, specs);
  sweep.report("2x3x2 mesh");
}

TEST(Planner, IllegalPairsThrow) {
  Mesh mesh({"x", "y"}, {2, 2});
  for (const auto& [f, t] : std::vector<std::pair<Placement, Placement>>{
           {S(0), kPsum}, {S(1), kPavg}, {S(0), kPmax}, {kPsum, kPavg}, {kPmax, kPmin},
           {kPavg, kPsum}}) {
    expect_semantic_error([&] { plan_redistribute(mesh, {kR, f}, {kR, t}); },
                          ErrorKind::IllegalRedistribute, f.str() + " -> " + t.str());
    EXPECT_NE(redistribute_illegal_reason({f}, {t}), "");
  }
  EXPECT_EQ(redistribute_illegal_reason({S(0)}, {kPsum}, true), "");
  EXPECT_NE(redistribute_illegal_reason({S(0)}, {kPavg}, true), "");
  EXPECT_NE(redistribute_illegal_reason({kPmax}, {kPsum}, true), "");
  EXPECT_NE(redistribute_illegal_reason({kR}, {kR, kR}), "");
  EXPECT_THROW(plan_redistribute(mesh, {kR}, {kR, kR}), SemanticError);
}

namespace {

// The kinds of a plan's steps, in order.
std::vector<StepKind> kinds(const std::vector<RedistStep>& plan) {
  std::vector<StepKind> out;
  for (const auto& s : plan) out.push_back(s.kind);
  return out;
}

void expect_exact(const Mesh& mesh, const Spec& from, const Spec& to, const Shape& shape,
                  const std::vector<RedistStep>& plan) {
  EXPECT_EQ(check_plan(mesh, from, to, Dense::iota(shape), plan), "")
      << spec_str(from) << " -> " << spec_str(to) << plan_str(plan);
}

}  // namespace

TEST(Planner, SingleStepPlans) {
  using K = std::vector<StepKind>;
  Mesh mesh({"x"}, {4});
  struct Case {
    Placement from, to;
    K want;
  };
  const std::vector<Case> cases = {
      {S(0), kRd, {StepKind::AllGather}},        {S(0), kR, {StepKind::AllGather}},
      {kPsum, S(0), {StepKind::ReduceScatter}},  {kPmax, S(1), {StepKind::ReduceScatter}},
      {S(0), S(1), {StepKind::AllToAll}},         {S(1), S(0), {StepKind::AllToAll}},
      {kPsum, kR, {StepKind::AllReduce}},         {kPavg, kRd, {StepKind::AllReduce}},
      {kR, S(0), {StepKind::LocalChunk}},         {kRd, S(1), {StepKind::LocalChunk}},
      {kR, kPsum, {StepKind::PartialFromReplicate}}, {kRd, kPmin, {StepKind::PartialFromReplicate}},
      {kR, kRd, {StepKind::Relabel}},             {kRd, kR, {StepKind::Relabel}},
      {S(0), S(0), {}},                           {kPmax, kPmax, {}},
  };
  for (const auto& c : cases) {
    auto plan = plan_redistribute(mesh, {c.from}, {c.to});
    EXPECT_EQ(kinds(plan), c.want) << c.from.str() << " -> " << c.to.str() << plan_str(plan);
    expect_exact(mesh, {c.from}, {c.to}, {13, 5}, plan);
  }
  auto ag = plan_redistribute(mesh, {S(0)}, {kRd});
  ASSERT_EQ(ag.size(), 1u);
  EXPECT_EQ(ag[0].dim, 0);
  EXPECT_EQ(ag[0].to, kRd);
  EXPECT_EQ(ag[0].str(), "all_gather(axis 0, dim=0): S(0) -> Rd");
  auto rs = plan_redistribute(mesh, {kPsum}, {S(0)});
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].op, ReduceOp::Sum);
  EXPECT_EQ(rs[0].dim, 0);
  auto a2a = plan_redistribute(mesh, {S(0)}, {S(1)});
  ASSERT_EQ(a2a.size(), 1u);
  EXPECT_EQ(a2a[0].split_dim, 1);
  EXPECT_EQ(a2a[0].concat_dim, 0);
  EXPECT_EQ(a2a[0].str(), "all_to_all(axis 0, split=1, concat=0): S(0) -> S(1)");
  // Gradients: S -> P(sum) is one zero-pad.
  auto pad = plan_redistribute(mesh, {S(1)}, {kPsum}, {PartialFromReplicate::Divide, true});
  EXPECT_EQ(kinds(pad), (K{StepKind::PadToPartial}));
  EXPECT_EQ(pad[0].dim, 1);
  expect_exact(mesh, {S(1)}, {kPsum}, {3, 6}, pad);
  // Both R -> P(sum) conventions.
  for (auto c : {PartialFromReplicate::Divide, PartialFromReplicate::Rank0}) {
    auto p = plan_redistribute(mesh, {kR}, {kPsum}, {c, false});
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].convention, c);
    expect_exact(mesh, {kR}, {kPsum}, {3, 3}, p);
  }
}

// Reducing an inner Partial whose op does not commute with a kept outer Partial would change the
// value (the outer axis reduces first): the planner reduces the outer axis too and makes it
// Partial again. Ops that commute (sum with avg, max with max) keep the outer axis.
TEST(Planner, MixedPartialsReduceTheOuterAxisFirst) {
  using K = std::vector<StepKind>;
  Mesh mesh({"x", "y"}, {2, 3});
  const K through_r = {StepKind::AllReduce, StepKind::AllReduce, StepKind::PartialFromReplicate};
  for (const auto& [from, to] : std::vector<std::pair<Spec, Spec>>{
           {{kPmax, kPsum}, {kPmax, kR}}, {{kPsum, kPmin}, {kPsum, kRd}},
           {{kPavg, kPmax}, {kPavg, kR}}, {{kPmin, kPmax}, {kPmin, kR}}}) {
    auto plan = plan_redistribute(mesh, from, to);
    EXPECT_EQ(kinds(plan), through_r) << spec_str(from) << plan_str(plan);
    expect_exact(mesh, from, to, {5, 2}, plan);
  }
  auto plan = plan_redistribute(mesh, {kPmax, kPsum}, {kPmax, S(1)});
  EXPECT_EQ(kinds(plan), (K{StepKind::AllReduce, StepKind::ReduceScatter,
                            StepKind::PartialFromReplicate}));
  expect_exact(mesh, {kPmax, kPsum}, {kPmax, S(1)}, {5, 7}, plan);
  EXPECT_EQ(kinds(plan_redistribute(mesh, {kPavg, kPsum}, {kPavg, kR})), K{StepKind::AllReduce});
  EXPECT_EQ(kinds(plan_redistribute(mesh, {kPmax, kPmax}, {kPmax, kR})), K{StepKind::AllReduce});
  // An inner axis of size 1 reduces nothing: the outer Partial stays.
  Mesh m21({"x", "y"}, {2, 1});
  EXPECT_EQ(kinds(plan_redistribute(m21, {kPmax, kPsum}, {kPmax, kR})), K{StepKind::Relabel});
  // Three axes: the rule is transitive (P(sum) on y is reduced for the P(max) on z, so the
  // P(max) on x is reduced for it).
  Mesh m3({"x", "y", "z"}, {2, 2, 2});
  const Spec from3 = {kPmax, kPsum, kPmax}, to3 = {kPmax, kPsum, kR};
  auto plan3 = plan_redistribute(m3, from3, to3);
  EXPECT_EQ(plan3.size(), 5u) << plan_str(plan3);
  expect_exact(m3, from3, to3, {3, 2}, plan3);
}

TEST(Planner, AxesOfSizeOneNeverCommunicate) {
  Mesh mesh({"x", "y"}, {1, 3});
  auto plan = plan_redistribute(mesh, {S(0), kPsum}, {kR, S(0)});
  for (const auto& s : plan) {
    if (s.axis == 0) {
      EXPECT_EQ(s.kind, StepKind::Relabel) << s.str();
      EXPECT_FALSE(s.communicates());
    }
  }
  expect_exact(mesh, {S(0), kPsum}, {kR, S(0)}, {5, 3}, plan);
}

TEST(Planner, NestedShardOnTwoByTwo) {
  Mesh mesh({"dp", "tp"}, {2, 2});
  auto plan = plan_redistribute(mesh, {S(0), S(0)}, {kR, S(0)});
  ASSERT_FALSE(plan.empty());
  for (const Shape& shape : std::vector<Shape>{{13, 2}, {4, 3}, {3, 1}, {0, 2}})
    expect_exact(mesh, {S(0), S(0)}, {kR, S(0)}, shape, plan);
  // The reverse, and the classic 2-D cases.
  for (const auto& [from, to] : std::vector<std::pair<Spec, Spec>>{
           {{kR, S(0)}, {S(0), S(0)}},
           {{S(0), S(1)}, {S(1), S(0)}},
           {{S(0), kPsum}, {S(0), S(0)}},
           {{kPsum, kPsum}, {S(0), S(1)}},
           {{S(1), S(0)}, {S(0), S(1)}},
           {{S(0), S(0)}, {S(1), S(1)}}}) {
    auto p = plan_redistribute(mesh, from, to);
    expect_exact(mesh, from, to, {13, 6}, p);
  }
}

// A Partial bound for a shard nested under a replicated outer axis: the outer axis chunks first
// (free), and the Partial reduce_scatters its chunk instead of all_reducing the whole.
TEST(Planner, APartialUnderAReplicatedOuterShardReduceScatters) {
  Mesh mesh({"cp", "tp"}, {2, 2});
  for (const Placement& outer : {kR, Placement::reduced()}) {
    const auto plan = plan_redistribute(mesh, {outer, kPsum}, {S(0), S(0)});
    ASSERT_EQ(plan.size(), 2u);
    EXPECT_EQ(plan[0].kind, StepKind::LocalChunk);
    EXPECT_EQ(plan[0].axis, 0);
    EXPECT_EQ(plan[1].kind, StepKind::ReduceScatter);
    for (const Shape& shape : std::vector<Shape>{{8, 4}, {13, 2}, {3, 1}})
      expect_exact(mesh, {outer, kPsum}, {S(0), S(0)}, shape, plan);
  }
  // Three axes, the Partial innermost.
  Mesh cube({"dp", "cp", "tp"}, {2, 2, 2});
  const auto plan = plan_redistribute(cube, {kR, kR, kPsum}, {S(1), S(1), S(1)});
  EXPECT_EQ(plan.back().kind, StepKind::ReduceScatter);
  expect_exact(cube, {kR, kR, kPsum}, {S(1), S(1), S(1)}, {3, 16}, plan);
}

TEST(Planner, StepNamesAndCommunication) {
  EXPECT_STREQ(step_kind_name(StepKind::AllGather), "all_gather");
  EXPECT_STREQ(step_kind_name(StepKind::ReduceScatter), "reduce_scatter");
  EXPECT_STREQ(step_kind_name(StepKind::AllReduce), "all_reduce");
  EXPECT_STREQ(step_kind_name(StepKind::AllToAll), "all_to_all");
  EXPECT_STREQ(step_kind_name(StepKind::LocalChunk), "local_chunk");
  EXPECT_STREQ(step_kind_name(StepKind::PartialFromReplicate), "partial_from_replicate");
  EXPECT_STREQ(step_kind_name(StepKind::PadToPartial), "pad_to_partial");
  EXPECT_STREQ(step_kind_name(StepKind::Relabel), "relabel");
  EXPECT_STREQ(partial_from_replicate_name(PartialFromReplicate::Divide), "divide");
  EXPECT_STREQ(partial_from_replicate_name(PartialFromReplicate::Rank0), "rank0");
  for (auto k : {StepKind::AllGather, StepKind::ReduceScatter, StepKind::AllReduce,
                 StepKind::AllToAll}) {
    RedistStep s;
    s.kind = k;
    EXPECT_TRUE(s.communicates()) << step_kind_name(k);
  }
  for (auto k : {StepKind::LocalChunk, StepKind::PartialFromReplicate, StepKind::PadToPartial,
                 StepKind::Relabel}) {
    RedistStep s;
    s.kind = k;
    EXPECT_FALSE(s.communicates()) << step_kind_name(k);
  }
}

// =============================================================================================
// 6. Cost model

TEST(CostModel, BusBandwidthVolumes) {
  const int64_t B = 1200;
  for (int64_t n = 1; n <= 8; ++n) {
    for (auto k : {StepKind::AllGather, StepKind::ReduceScatter, StepKind::AllToAll})
      EXPECT_EQ(collective_bytes(k, B, n), B * (n - 1) / n) << step_kind_name(k) << " n=" << n;
    EXPECT_EQ(collective_bytes(StepKind::AllReduce, B, n), 2 * B * (n - 1) / n) << n;
    for (auto k : {StepKind::LocalChunk, StepKind::PartialFromReplicate, StepKind::PadToPartial,
                   StepKind::Relabel})
      EXPECT_EQ(collective_bytes(k, B, n), 0) << step_kind_name(k);
  }
  for (auto k : {StepKind::AllGather, StepKind::ReduceScatter, StepKind::AllReduce,
                 StepKind::AllToAll})
    EXPECT_EQ(collective_bytes(k, B, 1), 0);
  EXPECT_EQ(collective_bytes(StepKind::AllGather, 1000, 3), 666);  // rounded down
  EXPECT_EQ(collective_bytes(StepKind::AllReduce, 1000, 3), 1333);
}

TEST(CostModel, FsdpExample) {
  // A [16, 4] float64 parameter sharded S(0) over 4 ranks, all_gathered: B = 512 bytes, and each
  // rank moves 3/4 of it.
  const int64_t full_bytes = numel({16, 4}) * 8;
  EXPECT_EQ(collective_bytes(StepKind::AllGather, full_bytes, 4), 384);
  // With Reduced the gradient comes back by reduce_scatter: the same 384, half of all_reduce's 768.
  EXPECT_EQ(collective_bytes(StepKind::ReduceScatter, full_bytes, 4), 384);
  EXPECT_EQ(collective_bytes(StepKind::AllReduce, full_bytes, 4), 768);
}

// ---------------------------------------------------------------------------------------------
// Rule coverage (core/coverage.h)

namespace meshsim {
namespace {

const CoverageRow* find_rule(const std::vector<CoverageRow>& rows, const std::string& key) {
  for (const auto& r : rows)
    if (r.key == key) return &r;
  return nullptr;
}

// Every row of every table is a key of the universe (so a new row is one the gate asks about),
// each once.
TEST(Coverage, UniverseHoldsEveryRowOnce) {
  const auto rows = coverage_universe();
  std::set<std::string> keys;
  for (const auto& r : rows) EXPECT_TRUE(keys.insert(r.key).second) << "twice: " << r.key;
  auto expect_rows = [&](const std::string& op, const std::vector<Shape>& shapes, const OpAttrs& a) {
    for (const auto& row : rule_rows_for(op, shapes, a))
      EXPECT_TRUE(keys.count("forward " + op + ": " + std::string(row.rule))) << op << ": " << row.rule;
  };
  size_t ops = 0;
  for (const auto& f : rule_families())
    for (const auto& op : f.ops) {
      OpAttrs a;
      a.dim = 1;
      a.length = 1;
      a.shape = {2, 2};
      a.sizes = {2, 1};
      a.dims = {1, 0};
      a.normalized_shape = {2};
      // A family of any number of operands: as many as the op takes (cat and stack: two).
      const int most = op_schema(op).max_args();
      const size_t n = f.arity != 0 ? f.arity : most < 0 ? 2 : static_cast<size_t>(most);
      const Shape s = op == "bmm" ? Shape{2, 2, 2} : op == "expand" ? Shape{1, 2} : Shape{2, 2};
      std::vector<Shape> shapes(n, s);
      if (f.name == "norm") shapes = {{2, 2}, {2}};
      if (f.name == "pick_target" || op == "index_select") shapes = {{2, 2}, {2}};  // index_select: a 1-D index
      if (op == "index_add") shapes = {{2, 2}, {2}, {2, 2}};                      // a 1-D index, source alike
      if (op == "item") shapes = {{1, 1}};                                         // a value of one element
      if (f.name == "attention") shapes = {{2, 2, 2, 2}, {2, 2, 2, 2}, {2, 2, 2, 2}};  // q, k, v [b, h, s, d]
      if (op == "bincount") shapes = {{2}};                                          // 1-D ids
      a.minlength = 2;
      a.num_classes = 2;
      a.repeats = 2;
      expect_rows(op, shapes, a);
      ++ops;
    }
  size_t with_family = 0;  // every op of the catalog that a rule family places
  for (const auto& schema : op_catalog()) with_family += *schema.family ? 1 : 0;
  EXPECT_EQ(ops, with_family);
  EXPECT_GE(ops, 48u);
  OpAttrs flat;
  flat.shape = {4};
  expect_rows("view", {{2, 2}}, flat);
  expect_rows("add", {{2, 2}, {2}}, {});
  expect_rows("matmul", {{2, 2, 2}, {2}}, {});
  EXPECT_TRUE(keys.count("redistribute: all_gather S -> Rd"));
  EXPECT_TRUE(keys.count("redistribute: pad_to_partial S -> P(sum) (gradient)"));
}

// Reasons are derived from the rules: the operand of a non-linear op is never Partial, and no
// incoming gradient is P(avg); what a forward row and a cotangent give is reachable.
TEST(Coverage, UnreachableRulesCarryTheirReason) {
  const auto rows = coverage_universe();
  const CoverageRow* partial_exp = find_rule(rows, "backward exp d0: mul P(sum), R -> P(sum)");
  ASSERT_NE(partial_exp, nullptr);
  EXPECT_EQ(partial_exp->unreachable, "no forward row gives the operands and output it reads");
  const CoverageRow* avg_g = find_rule(rows, "backward mm d0: mm P(avg), R -> P(avg)");
  ASSERT_NE(avg_g, nullptr);
  EXPECT_NE(avg_g->unreachable.find("incoming gradient would have to be P(avg)"), std::string::npos) << avg_g->unreachable;
  const CoverageRow* reachable = find_rule(rows, "backward mm d0: mm R, S(1) -> S(1)");
  ASSERT_NE(reachable, nullptr);
  EXPECT_EQ(reachable->unreachable, "");
  const CoverageRow* max_grad = find_rule(rows, "redistribute: all_reduce P(max) -> R (gradient)");
  ASSERT_NE(max_grad, nullptr);
  EXPECT_NE(max_grad->unreachable, "");
  EXPECT_EQ(find_rule(rows, "redistribute: all_reduce P(max) -> R")->unreachable, "");
}

// The rules report hits only inside a scope, and the keys are the universe's.
TEST(Coverage, HitsAreRecordedInsideAScopeOnly) {
  const Mesh mesh({"a"}, {2});
  const auto decide = [&] {
    propagate("mm", mesh, {{Placement::shard(1)}, {Placement::shard(0)}}, {{4, 6}, {6, 2}}, {});
    plan_redistribute(mesh, {Placement::shard(0)}, {Placement::reduced()});
  };
  decide();  // no sink
  CoverageSink sink;
  {
    CoverageScope scope(&sink);
    decide();
    backward_rule("mm", mesh, {{Placement::shard(1)}, {Placement::shard(0)}}, {Placement::partial()}, {{4, 6}, {6, 2}},
                  {}, {Placement::reduced()}, 0);
  }
  decide();
  EXPECT_EQ(sink, (CoverageSink{"forward mm: S(1), S(0) -> P(sum)", "redistribute: all_gather S -> Rd",
                                "backward mm d0: mm R, S(1) -> S(1)"}));
  const auto rows = coverage_universe();
  for (const auto& key : sink) EXPECT_NE(find_rule(rows, key), nullptr) << key;
}

}  // namespace
}  // namespace meshsim
