#include "core/placement.h"

#include "core/error.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace meshsim {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Norm: return "norm";
  }
  return "sum";
}

std::string norm_p_str(double p) {
  for (int digits = 1; digits <= 17; ++digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, p);
    if (std::strtod(buf, nullptr) == p) return buf;
  }
  return std::to_string(p);
}

ReduceOp parse_reduce_op(std::string_view text) {
  if (text == "sum") return ReduceOp::Sum;
  if (text == "avg") return ReduceOp::Avg;
  if (text == "max") return ReduceOp::Max;
  if (text == "min") return ReduceOp::Min;
  throw std::invalid_argument("unknown reduce op \"" + shown(std::string(text)) +
                              "\" (expected sum, avg, max or min)");
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard:
      if (split > 1) return "SS(" + std::to_string(dim) + "," + std::to_string(split) + ")";
      return "S(" + std::to_string(dim) + ")";
    case Kind::Replicate: return "R";
    case Kind::Partial:
      if (op == ReduceOp::Norm) return "P(norm" + norm_p_str(norm) + ")";
      return std::string("P(") + reduce_op_name(op) + ")";
    case Kind::Reduced: return "Rd";
  }
  return "R";
}

std::string Placement::pytorch_str() const {
  switch (kind) {
    case Kind::Shard:
      if (split > 1)
        return "_StridedShard(dim=" + std::to_string(dim) + ", split_factor=" + std::to_string(split) + ")";
      return "Shard(dim=" + std::to_string(dim) + ")";
    case Kind::Replicate: return "Replicate()";
    case Kind::Partial:
      if (op == ReduceOp::Norm) return "_NormPartial(" + norm_p_str(norm) + ")";
      return std::string("Partial(") + reduce_op_name(op) + ")";
    case Kind::Reduced: return "Reduced()";
  }
  return "Replicate()";
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "Name(arg)" into name and arg; a bare "Name" has an empty arg and has_parens false.
bool split_call(std::string_view s, std::string_view& name, std::string_view& arg) {
  auto open = s.find('(');
  if (open == std::string_view::npos) {
    name = s;
    arg = {};
    return false;
  }
  if (s.back() != ')') throw std::invalid_argument("unbalanced parentheses");
  name = trim(s.substr(0, open));
  arg = trim(s.substr(open + 1, s.size() - open - 2));
  return true;
}

std::string_view strip_keyword(std::string_view arg, std::string_view key) {
  auto eq = arg.find('=');
  if (eq == std::string_view::npos) return arg;
  if (trim(arg.substr(0, eq)) != key) throw std::invalid_argument("unknown argument name");
  return trim(arg.substr(eq + 1));
}

// A decimal integer in [-limit, limit] (a sign only where `negative` allows it).
int64_t parse_int(std::string_view arg, int64_t limit, bool negative, const char* what) {
  const bool minus = negative && !arg.empty() && arg.front() == '-';
  if (minus) arg.remove_prefix(1);
  if (arg.empty()) throw std::invalid_argument(std::string("missing ") + what);
  int64_t v = 0;
  for (char c : arg) {
    if (!std::isdigit(static_cast<unsigned char>(c))) throw std::invalid_argument(std::string("bad ") + what);
    v = v * 10 + (c - '0');
    if (v > limit) throw std::invalid_argument(std::string(what) + " out of range");
  }
  return minus ? -v : v;
}

// Shard dims: -64..64 (negative ones count from the end).
int64_t parse_dim(std::string_view arg) { return parse_int(arg, 64, true, "shard dim"); }

// "d, k", "dim=d, split_factor=k" (either keyword optional) -> SS(d, k); a split of 1 is S(d).
Placement parse_strided(std::string_view arg) {
  auto comma = arg.find(',');
  if (comma == std::string_view::npos) throw std::invalid_argument("expected a dim and a split factor");
  int64_t dim = parse_dim(strip_keyword(trim(arg.substr(0, comma)), "dim"));
  int64_t split = parse_int(strip_keyword(trim(arg.substr(comma + 1)), "split_factor"), 65536, false, "split factor");
  if (split < 1) throw std::invalid_argument("split factor must be at least 1");
  return split == 1 ? Placement::shard(dim) : Placement::strided_shard(dim, split);
}

// A norm's p: a finite decimal number, not 0.
double parse_norm_p(std::string_view arg) {
  const std::string text(arg);
  char* end = nullptr;
  const double p = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(p) || p == 0 ||
      !(std::isdigit(static_cast<unsigned char>(text.back())) || text.back() == '.'))
    throw std::invalid_argument("a norm's p must be a finite number other than 0 (an inf norm's partial is P(max), "
                                "a 0 norm's P(sum))");
  return p;
}

}  // namespace

Placement parse_placement(std::string_view raw) {
  std::string_view text = trim(raw);
  try {
    std::string_view name, arg;
    bool parens = split_call(text, name, arg);
    if (name == "S" || name == "Shard") {
      if (!parens) throw std::invalid_argument("missing shard dim");
      return Placement::shard(parse_dim(strip_keyword(arg, "dim")));
    }
    if (name == "SS" || name == "_StridedShard" || name == "StridedShard") {
      if (!parens) throw std::invalid_argument("missing dim and split factor");
      return parse_strided(arg);
    }
    if (name == "R" || name == "Replicate") {
      if (!arg.empty()) throw std::invalid_argument("Replicate takes no argument");
      if (name == "Replicate" && !parens) throw std::invalid_argument("write Replicate()");
      return Placement::replicate();
    }
    if (name == "Rd" || name == "Reduced") {
      if (!arg.empty()) throw std::invalid_argument("Reduced takes no argument");
      if (name == "Reduced" && !parens) throw std::invalid_argument("write Reduced()");
      return Placement::reduced();
    }
    if (name == "_NormPartial" || name == "NormPartial") {
      if (!parens) throw std::invalid_argument("missing norm type");
      return Placement::partial_norm(parse_norm_p(strip_keyword(arg, "norm_type")));
    }
    if (name == "P" && arg.substr(0, 4) == "norm") return Placement::partial_norm(parse_norm_p(trim(arg.substr(4))));
    if (name == "P" || name == "Partial") {
      if (!parens) throw std::invalid_argument("missing reduce op");
      std::string_view op = strip_keyword(arg, "reduce_op");
      if (op.size() >= 2 && (op.front() == '"' || op.front() == '\'')) op = op.substr(1, op.size() - 2);
      if (op.empty()) {
        if (name == "P") throw std::invalid_argument("missing reduce op");
        return Placement::partial(ReduceOp::Sum);
      }
      return Placement::partial(parse_reduce_op(op));
    }
    throw std::invalid_argument("unknown placement");
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("bad placement \"" + shown(std::string(raw)) + "\": " + e.what() +
                                " (expected S(d), SS(d,k), R, P(sum|avg|max|min), P(normP), Rd or the PyTorch "
                                "spellings Shard(d), _StridedShard(d, k), Replicate(), Partial(), _NormPartial(p), "
                                "Reduced())");
  }
}

std::string spec_str(const Spec& spec) {
  std::string out = "[";
  for (size_t i = 0; i < spec.size(); ++i) {
    if (i) out += ", ";
    out += spec[i].str();
  }
  return out + "]";
}

std::vector<Placement> all_placements(int64_t max_dim) {
  std::vector<Placement> out;
  for (int64_t d = 0; d < max_dim; ++d) out.push_back(Placement::shard(d));
  out.push_back(Placement::replicate());
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
    out.push_back(Placement::partial(op));
  out.push_back(Placement::reduced());
  return out;
}

std::vector<Placement> all_placements_with_strided(int64_t max_dim, int64_t split) {
  std::vector<Placement> out = all_placements(max_dim);
  for (int64_t d = 0; d < max_dim; ++d) out.push_back(Placement::strided_shard(d, split));
  return out;
}

bool shards_dim(const Spec& spec, int64_t dim) {
  for (const auto& p : spec)
    if (p.is_shard() && p.dim == dim) return true;
  return false;
}

}  // namespace meshsim
