#include "core/redistribute.h"

#include <set>

#include "core/coverage.h"
#include "core/error.h"

namespace meshsim {

const char* step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::AllGather: return "all_gather";
    case StepKind::ReduceScatter: return "reduce_scatter";
    case StepKind::AllReduce: return "all_reduce";
    case StepKind::AllToAll: return "all_to_all";
    case StepKind::LocalChunk: return "local_chunk";
    case StepKind::PartialFromReplicate: return "partial_from_replicate";
    case StepKind::PadToPartial: return "pad_to_partial";
    case StepKind::RescalePartial: return "rescale_partial";
    case StepKind::Relabel: return "relabel";
  }
  return "relabel";
}

const char* partial_from_replicate_name(PartialFromReplicate c) {
  return c == PartialFromReplicate::Divide ? "divide" : "rank0";
}

bool RedistStep::communicates() const {
  return kind == StepKind::AllGather || kind == StepKind::ReduceScatter ||
         kind == StepKind::AllReduce || kind == StepKind::AllToAll;
}

std::string RedistStep::str() const {
  std::string out = step_kind_name(kind);
  out += "(axis " + std::to_string(axis);
  if (kind == StepKind::AllGather || kind == StepKind::ReduceScatter ||
      kind == StepKind::LocalChunk || kind == StepKind::PadToPartial)
    out += ", dim=" + std::to_string(dim);
  if (split_factor > 1) out += ", split=" + std::to_string(split_factor);
  if (kind == StepKind::AllToAll)
    out += ", split=" + std::to_string(split_dim) + ", concat=" + std::to_string(concat_dim);
  if (kind == StepKind::AllReduce || kind == StepKind::ReduceScatter)
    out += std::string(", ") + reduce_op_name(op);
  out += "): " + from.str() + " -> " + to.str();
  return out;
}

namespace {

std::string axis_illegal(const Placement& f, const Placement& t, bool gradient) {
  if (f == t || !t.is_partial()) return {};
  if (t.is_norm_partial())
    return f.str() + " -> " + t.str() + " is illegal: a norm's partial comes only from a vector norm over a sharded dim";
  if (f.is_shard()) {
    if (gradient && t.op == ReduceOp::Sum) return {};
    return f.str() + " -> " + t.str() + " is illegal: a shard cannot become a partial";
  }
  if (f.is_partial()) {
    const bool linear = is_linear(f.op) && is_linear(t.op);
    if (gradient && linear) return {};
    return f.str() + " -> " + t.str() + " is illegal: a partial cannot change its reduce op";
  }
  return {};
}

bool touches(const Spec& a, const Spec& b, size_t axis, int64_t dim) {
  return (a[axis].is_shard() && a[axis].dim == dim) || (b[axis].is_shard() && b[axis].dim == dim);
}

struct Planner {
  const Mesh& mesh;
  const Spec& from;
  const Spec& to;
  const PlanOptions& options;
  Spec cur;
  std::vector<RedistStep> steps;
  // Per axis: whether it is the outer axis of a nested strided shard (see nested_strided).
  std::vector<bool> nested;

  void emit(RedistStep s) {
    s.from = cur[s.axis];
    if (mesh.axis_size(s.axis) == 1) s.kind = StepKind::Relabel;
    cur[s.axis] = s.to;
    steps.push_back(s);
  }

  // An axis keeps its placement when it does not change and, if it shards dim d, no outer axis
  // that shards d changes (the nesting order of chunks stays valid); if it is Partial, no inner
  // axis with a Partial that does not commute with it is reduced (the global value reduces the
  // outer Partial axes first, so the outer one is reduced too and made Partial again after).
  //
  // The one exception is a nested strided shard (FSDP over TP): an inner plain S(d) stays in place
  // when the outer axis of d that changes is nested_strided (fills `nested`).
  std::vector<bool> kept() {
    std::vector<bool> keep(from.size(), false);
    nested.assign(from.size(), false);
    for (size_t a = 0; a < from.size(); ++a) {
      if (from[a] != to[a]) {
        if (nested_strided(a)) {
          nested[a] = true;
          for (size_t b = 0; b < a; ++b)
            if (touches(from, to, b, from[a].is_shard() ? from[a].dim : to[a].dim) && !keep[b]) nested[a] = false;
        }
        continue;
      }
      bool ok = true;
      if (from[a].is_shard())
        for (size_t b = 0; b < a; ++b)
          if (touches(from, to, b, from[a].dim) && !keep[b] && !nested[b]) ok = false;
      keep[a] = ok;
    }
    for (size_t a = from.size(); a-- > 0;) {
      if (!from[a].is_partial()) continue;
      for (size_t b = a + 1; b < from.size(); ++b)
        if (from[b].is_partial() && !keep[b] && mesh.axis_size(static_cast<int>(b)) > 1 &&
            !commute(from[a].op, from[b].op))
          keep[a] = false;
    }
    return keep;
  }

  // Axis a goes between SS(d,k) and R or Rd (either way), or from a Partial to SS(d,k); every inner
  // axis that touches d is S(d) in both specs, and k is the product of their sizes. Then the rank's
  // sub-chunks of the k pieces are exactly the inner axes' chunks, so those stay in place and axis a
  // moves alone with split factor 1: SS(d,k) over dp nested over S(d) over tp is FSDP2 over TP.
  // (The caller also asks that every outer axis of d is kept.)
  bool nested_strided(size_t a) const {
    const Placement &f = from[a], &t = to[a];
    if (f == t || f.is_strided() == t.is_strided()) return false;
    const Placement& ss = f.is_strided() ? f : t;
    const Placement& other = f.is_strided() ? t : f;
    if (other.is_shard() || (other.is_partial() && f.is_strided())) return false;  // SS -> P: a gradient's pad
    int64_t m = 1;
    for (size_t b = a + 1; b < from.size(); ++b) {
      if (!touches(from, to, b, ss.dim)) continue;
      if (from[b] != Placement::shard(ss.dim) || to[b] != from[b]) return false;
      m *= mesh.axis_size(static_cast<int>(b));
    }
    return m == ss.split;
  }

  // The split factor of a step on axis a whose strided side is p: the pieces whose sub-chunks the
  // local holds now, k over the sizes of the inner axes that plainly shard p.dim now.
  int64_t split_for(int a, const Placement& p) const {
    if (!p.is_strided()) return 1;
    int64_t m = 1;
    for (size_t b = static_cast<size_t>(a) + 1; b < cur.size(); ++b) {
      if (!cur[b].is_shard() || cur[b].dim != p.dim) continue;
      if (cur[b].is_strided())
        throw SemanticError(ErrorKind::IllegalRedistribute,
                            "redistribute " + spec_str(from) + " -> " + spec_str(to) + ": mesh axis " + std::to_string(a) +
                                ": " + p.str() + " would move under the strided " + cur[b].str() +
                                " of mesh axis " + std::to_string(b) + ", which meshsim does not plan");
      m *= mesh.axis_size(static_cast<int>(b));
    }
    if (p.split % m != 0)
      throw SemanticError(ErrorKind::IllegalRedistribute,
                          "redistribute " + spec_str(from) + " -> " + spec_str(to) + ": mesh axis " + std::to_string(a) +
                              ": " + p.str() + " is nested over inner mesh axes that shard dim " + std::to_string(p.dim) +
                              " " + std::to_string(m) + " ways, which does not divide its split factor " +
                              std::to_string(p.split));
    return p.split / m;
  }

  // Whether a Partial axis must be reduced because an inner Partial that does not commute with it
  // is reduced (the rule kept() applies to axes that do not change).
  bool reduced_before_inner(const std::vector<bool>& keep, int a) const {
    if (!from[a].is_partial()) return false;
    for (size_t b = static_cast<size_t>(a) + 1; b < from.size(); ++b)
      if (from[b].is_partial() && !keep[b] && mesh.axis_size(static_cast<int>(b)) > 1 &&
          !commute(from[a].op, from[b].op))
        return true;
    return false;
  }

  static bool commute(ReduceOp x, ReduceOp y) {
    return x == y || (is_linear(x) && is_linear(y));
  }

  bool all_to_all_allowed(size_t a, int64_t i, int64_t j) const {
    for (size_t b = 0; b < from.size(); ++b)
      if (b != a && (touches(from, to, b, i) || touches(from, to, b, j))) return false;
    return true;
  }

  // Inner axes that shard d are allowed only under a nested strided target (they are kept then).
  bool reduce_scatter_allowed(size_t a, int64_t d) const {
    for (size_t b = 0; b < a; ++b)
      if (to[b].is_shard() && to[b].dim == d && cur[b] != to[b]) return false;
    for (size_t b = a + 1; b < cur.size(); ++b)
      if (cur[b].is_shard() && cur[b].dim == d && !nested[a]) return false;
    return true;
  }

  // A Partial axis a bound for S(d) under outer axes that are replicated now and plainly shard d in
  // the target: their local chunks (free) go first, so that a reduces with a reduce_scatter of its
  // chunk instead of an all_reduce of the whole ([R, P(sum)] -> [S(0), S(0)]: 1/4 of the bytes on 2
  // x 2). Done only when it makes the reduce_scatter allowed.
  void chunk_outer_replicas(const std::vector<bool>& keep, int a, int64_t d) {
    for (size_t b = static_cast<size_t>(a) + 1; b < cur.size(); ++b)
      if (cur[b].is_shard() && cur[b].dim == d && !nested[a]) return;
    std::vector<int> outer;
    for (int b = 0; b < a; ++b) {
      if (!(to[b].is_shard() && to[b].dim == d) || cur[b] == to[b]) continue;
      if (keep[b] || to[b].is_strided() || !(cur[b].is_plain_replicate() || cur[b].is_reduced())) return;
      outer.push_back(b);
    }
    for (int b : outer) {
      RedistStep s;
      s.axis = b;
      s.to = to[b];
      s.kind = StepKind::LocalChunk;
      s.dim = d;
      emit(s);
    }
  }

  void run() {
    cur = from;
    const auto keep = kept();
    const int n = static_cast<int>(from.size());
    // Phase A: unshard, innermost axis first.
    for (int a = n - 1; a >= 0; --a) {
      if (keep[a] || !cur[a].is_shard()) continue;
      const Placement& t = to[a];
      const int64_t d = cur[a].dim;
      RedistStep s;
      s.axis = a;
      if (t.is_shard() && !t.is_strided() && !cur[a].is_strided() && all_to_all_allowed(a, d, t.dim)) {
        s.kind = StepKind::AllToAll;
        s.split_dim = t.dim;
        s.concat_dim = d;
        s.to = t;
      } else if (t.is_partial()) {  // gradients only: legality was checked
        s.kind = StepKind::PadToPartial;
        s.dim = d;
        s.split_factor = split_for(a, cur[a]);
        s.to = t;
      } else {
        s.kind = StepKind::AllGather;
        s.dim = d;
        s.split_factor = split_for(a, cur[a]);
        s.to = t.is_reduced() ? Placement::reduced() : Placement::replicate();
      }
      emit(s);
    }
    // Phase B: reduce partials.
    for (int a = 0; a < n; ++a) {
      // A Partial that is already the target is reduced only when kept() refused to keep it.
      if (keep[a] || !cur[a].is_partial() || (cur[a] == to[a] && !from[a].is_partial())) continue;
      const Placement& t = to[a];
      RedistStep s;
      s.axis = a;
      s.op = cur[a].op;
      // Gradients: P(avg) <-> P(sum) is a local rescale (legality was checked), unless an inner
      // Partial that does not commute with it is reduced: then this axis is reduced first.
      if (t.is_shard() && !reduce_scatter_allowed(a, t.dim)) chunk_outer_replicas(keep, a, t.dim);
      if (t.is_partial() && t.op != cur[a].op && !reduced_before_inner(keep, a)) {
        s.kind = StepKind::RescalePartial;
        s.to = t;
      } else if (t.is_shard() && reduce_scatter_allowed(a, t.dim)) {
        s.kind = StepKind::ReduceScatter;
        s.dim = t.dim;
        s.split_factor = split_for(a, t);
        s.to = t;
      } else {
        s.kind = StepKind::AllReduce;
        s.to = t.is_reduced() ? Placement::reduced() : Placement::replicate();
      }
      emit(s);
    }
    // Phase C: shard, relabel and make partials, outermost axis first.
    for (int a = 0; a < n; ++a) {
      if (keep[a] || cur[a] == to[a]) continue;
      const Placement& t = to[a];
      RedistStep s;
      s.axis = a;
      s.to = t;
      if (t.is_shard()) {
        s.kind = StepKind::LocalChunk;
        s.dim = t.dim;
        s.split_factor = split_for(a, t);
      } else if (t.is_partial()) {
        s.kind = StepKind::PartialFromReplicate;
        s.op = t.op;
        s.convention = options.partial_from_replicate;
      } else {
        s.kind = StepKind::Relabel;
      }
      emit(s);
    }
  }
};

}  // namespace

std::string redistribute_illegal_reason(const Spec& from, const Spec& to, bool gradient) {
  if (from.size() != to.size()) return "specs differ in length";
  for (size_t a = 0; a < from.size(); ++a) {
    std::string why = axis_illegal(from[a], to[a], gradient);
    if (!why.empty()) return "mesh axis " + std::to_string(a) + ": " + why;
  }
  return {};
}

std::vector<RedistStep> plan_redistribute(const Mesh& mesh, const Spec& from, const Spec& to,
                                          const PlanOptions& options) {
  std::string why = redistribute_illegal_reason(from, to, options.gradient);
  if (!why.empty())
    throw SemanticError(ErrorKind::IllegalRedistribute,
                        "redistribute " + spec_str(from) + " -> " + spec_str(to) + ": " + why);
  Planner p{mesh, from, to, options, {}, {}, {}};
  p.run();
  if (coverage_sink())
    for (const auto& s : p.steps) cover(coverage_key(s, options.gradient));
  return p.steps;
}

std::string coverage_key(const RedistStep& s, bool gradient) {
  // A norm's partial is one key whatever its p: P(norm).
  auto kind = [](const Placement& p) {
    return p.is_shard() ? std::string("S") : p.is_norm_partial() ? std::string("P(norm)") : p.str();
  };
  std::string key = "redistribute: " + std::string(step_kind_name(s.kind)) + " " + kind(s.from) + " -> " + kind(s.to);
  if (s.kind == StepKind::PartialFromReplicate && s.op == ReduceOp::Sum)
    key += std::string(" ") + partial_from_replicate_name(s.convention);
  return gradient ? key + " (gradient)" : key;
}

namespace {

// Why a planner step can never be asked for, or "": a forward step can (any legal pair of
// placements is a redistribute a program may write); a gradient's are limited by what gradients are.
std::string unreachable_step(StepKind kind, const Placement& from, const Placement& to, bool gradient) {
  if (!gradient) return {};
  if (from.is_partial() && !is_linear(from.op))
    return "no gradient is P(max), P(min) or P(normP): they have no cotangent";
  if (to.is_partial() && to.op != ReduceOp::Sum)
    return "a gradient is moved only to a cotangent (S(d), R, P(sum), Rd) or to the gradient slot of a backward "
           "row, and no reachable backward row has P(avg), P(max) or P(min) there";
  if (kind == StepKind::Relabel && from.is_partial() && from.op == ReduceOp::Avg && to.is_shard())
    return "on an axis of size 1 every row costs nothing and ties go to the earlier row: an operand sharded there "
           "fits the shard rows, which come before the rows that give a P(avg) contribution (R, P(avg) of mul "
           "and mm), so no P(avg) gradient has a sharded source there (a strided shard over an axis of size 1, "
           "which fits no row, could: the generators draw none there, as it holds the whole dim)";
  return {};
}

}  // namespace

std::vector<CoverageRow> redistribution_coverage() {
  std::vector<CoverageRow> rows;
  std::set<std::string> seen;
  std::vector<Placement> placements = all_placements(2);
  placements.push_back(Placement::partial_norm(2));  // a vector norm's result, reduced to R or S(d)
  for (int64_t n : {2, 1})
    for (bool gradient : {false, true})
      for (auto convention : {PartialFromReplicate::Divide, PartialFromReplicate::Rank0})
        for (const auto& from : placements)
          for (const auto& to : placements) {
            if (!redistribute_illegal_reason({from}, {to}, gradient).empty()) continue;
            for (const auto& s : plan_redistribute(Mesh({"a"}, {n}), {from}, {to}, {convention, gradient}))
              if (seen.insert(coverage_key(s, gradient)).second)
                rows.push_back({coverage_key(s, gradient), unreachable_step(s.kind, s.from, s.to, gradient)});
          }
  return rows;
}

}  // namespace meshsim
