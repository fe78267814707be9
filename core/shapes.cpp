// infer_shape(): the shape of an op's result, by its family.
#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/propagation.h"
#include "core/rules/common.h"

namespace meshsim {

using namespace rules;

// ---------------------------------------------------------------------------------------------
// Shapes

namespace {

Shape broadcast_shapes(const std::string& op, const std::vector<Shape>& s) {
  size_t rank = 0;
  for (const auto& x : s) rank = std::max(rank, x.size());
  Shape out(rank, 1);
  for (const auto& x : s)
    for (size_t i = 0; i < x.size(); ++i) {
      int64_t& o = out[out.size() - x.size() + i];
      if (x[i] == o || x[i] == 1) continue;
      if (o != 1)
        throw SemanticError(ErrorKind::ShapeMismatch, op + ": operand shapes " + shape_str(s[0]) + " and " +
                                                          shape_str(s[1]) + (s.size() > 2 ? " and " + shape_str(s[2]) : "") +
                                                          " do not broadcast (dim " + std::to_string(i) + " of " +
                                                          shape_str(x) + ")");
      o = x[i];
    }
  return out;
}

// A shape with one -1 filled in so that it holds `count` elements; ShapeMismatch otherwise.
Shape filled(const std::string& op, Shape shape, int64_t count, const Shape& from) {
  int64_t known = 1, unknown = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (unknown >= 0) throw SemanticError(ErrorKind::ShapeMismatch, op + ": only one dim may be -1 in " + shape_str(shape));
      unknown = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      throw SemanticError(ErrorKind::ShapeMismatch, op + ": negative extent in " + shape_str(shape));
    } else {
      known *= shape[i];
    }
  }
  if (unknown >= 0) {
    if (known == 0 || count % known != 0)
      throw SemanticError(ErrorKind::ShapeMismatch,
                          op + ": " + shape_str(shape) + " cannot hold the " + std::to_string(count) +
                              " elements of " + shape_str(from));
    shape[unknown] = count / known;
  }
  if (numel(shape) != count)
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + shape_str(shape) + " holds " +
                                                      std::to_string(numel(shape)) + " elements, " + shape_str(from) +
                                                      " holds " + std::to_string(count));
  return shape;
}

Shape matmul_shape(const std::string& op, const Shape& a, const Shape& b) {
  auto fail = [&](const std::string& why) {
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why + ": " + shape_str(a) + " @ " + shape_str(b));
  };
  if (a.empty() || b.empty()) fail("needs operands of at least 1 dim");
  if (op == "bmm") {
    if (a.size() != 3 || b.size() != 3) fail("needs 3-D operands");
    if (a[0] != b[0]) fail("batch dims differ");
  }
  const int64_t ka = a.back(), kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb) fail("inner dims differ");
  const Shape ba(a.begin(), a.end() - std::min<size_t>(a.size(), 2)), bb(b.begin(), b.end() - std::min<size_t>(b.size(), 2));
  Shape out = ba.size() || bb.size() ? broadcast_shapes(op, {ba.empty() ? Shape{} : ba, bb.empty() ? Shape{} : bb}) : Shape{};
  if (a.size() >= 2) out.push_back(a[a.size() - 2]);
  if (b.size() >= 2) out.push_back(b.back());
  return out;
}

// scaled_dot_product_attention(q [b, h, sq, d], k [b, hk, sk, d], v [b, hk, sk, dv], mask?): the
// result [b, h, sq, dv]; hk is h, or (enable_gqa) divides it; the mask broadcasts to [b, h, sq, sk].
Shape attention_shape(const std::string& op, const std::vector<Shape>& s, const OpAttrs& a) {
  auto fail = [&](const std::string& why) { throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why); };
  if (s.size() < 3 || s.size() > 4)
    fail("takes q, k, v and an optional attn_mask, got " + std::to_string(s.size()) + " operand(s)");
  const char* names[] = {"q", "k", "v"};
  for (size_t i = 0; i < 3; ++i)
    if (s[i].size() != 4) fail(std::string(names[i]) + " must be 4-D [b, h, s, d], got " + shape_str(s[i]));
  const Shape &q = s[0], &k = s[1], &v = s[2];
  const std::string all = "q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v);
  if (k[0] != q[0] || v[0] != q[0]) fail("batch dims differ: " + all);
  if (k[3] != q[3]) fail("q and k have different head dims: " + all);
  if (v[2] != k[2]) fail("k and v have different sequence lengths: " + all);
  if (v[1] != k[1]) fail("k and v have different numbers of heads: " + all);
  if (a.enable_gqa ? (k[1] == 0 || q[1] % k[1] != 0) : k[1] != q[1])
    fail(a.enable_gqa ? "k's heads " + std::to_string(k[1]) + " do not divide q's " + std::to_string(q[1]) + ": " + all
                      : "q and k have different numbers of heads (enable_gqa is false): " + all);
  const Shape out = {q[0], q[1], q[2], v[3]};
  if (s.size() == 4 && a.is_causal)
    fail("an attn_mask with is_causal (PyTorch refuses both: fold the causal mask into the attn_mask)");
  if (s.size() == 4) {
    const Shape scores = {q[0], q[1], q[2], k[2]};
    bool fits = s[3].size() <= 4;
    for (size_t i = 0; fits && i < s[3].size(); ++i) {
      const int64_t e = s[3][i], want = scores[4 - s[3].size() + i];
      fits = e == 1 || e == want;
    }
    if (!fits) fail("attn_mask " + shape_str(s[3]) + " does not broadcast to the scores [b, h, sq, sk] " + shape_str(scores));
  }
  return out;
}

}  // namespace

Shape infer_shape(const std::string& op, const std::vector<Shape>& s, const OpAttrs& attrs) {
  auto fail = [&](const std::string& why) {
    throw SemanticError(ErrorKind::ShapeMismatch, op + ": " + why);
  };
  const Family& f = family_of(op);
  const std::string& family = f.names.name;
  if (f.arity == 0 ? s.empty() : s.size() != f.arity)
    fail("takes " + (f.arity ? std::to_string(f.arity) : std::string("one or more")) + " operand(s), got " +
         std::to_string(s.size()));
  const auto rank = static_cast<int64_t>(s[0].size());
  const OpAttrs a = resolved(op, attrs, rank, shape_str(s[0]));
  if (family == "mm") {
    if (s[0].size() != 2 || s[1].size() != 2)
      fail("needs 2-D operands, got " + shape_str(s[0]) + " and " + shape_str(s[1]));
    if (s[0][1] != s[1][0]) fail("inner dims differ: " + shape_str(s[0]) + " @ " + shape_str(s[1]));
    return {s[0][0], s[1][1]};
  }
  if (family == "matmul") return matmul_shape(op, s[0], s[1]);
  if (family == "masked_fill") {
    if (broadcast_shapes(op, s) != s[0]) fail("the mask " + shape_str(s[1]) + " does not broadcast to " + shape_str(s[0]));
    return s[0];
  }
  if (family == "repeat") {  // Tensor.repeat(*sizes): leading sizes add dims
    if (a.sizes.size() < s[0].size())
      fail("sizes " + shape_str(a.sizes) + " has fewer entries than " + shape_str(s[0]) + " has dims");
    Shape out = a.sizes;
    const size_t lead = a.sizes.size() - s[0].size();
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] < 0) fail("negative size in " + shape_str(a.sizes));
      if (i >= lead && __builtin_mul_overflow(out[i], s[0][i - lead], &out[i]))
        fail("sizes " + shape_str(a.sizes) + " of " + shape_str(s[0]) + " give a dim past 2^63 elements");
    }
    return out;
  }
  if (family == "repeat_interleave") {
    if (a.repeats < 0) fail("repeats " + std::to_string(a.repeats) + " is negative");
    Shape out = s[0];
    if (__builtin_mul_overflow(out[static_cast<size_t>(*a.dim)], a.repeats, &out[static_cast<size_t>(*a.dim)]))
      fail("repeats " + std::to_string(a.repeats) + " of " + shape_str(s[0]) + " give a dim past 2^63 elements");
    return out;
  }
  if (family == "attention") return attention_shape(op, s, a);
  if (family == "embedding") {
    if (s[1].size() != 2) fail("the weight must be 2-D [vocab, dim], got " + shape_str(s[1]));
    Shape out = s[0];
    out.push_back(s[1][1]);
    return out;
  }
  if (family == "index") {  // gather, index_select: dim of x (wrapped above)
    const auto d = static_cast<size_t>(*a.dim);
    if (op == "index_select") {
      if (s[1].size() != 1) fail("the index must be 1-D, got " + shape_str(s[1]));
      Shape out = s[0];
      out[d] = s[1][0];
      return out;
    }
    if (s[1].size() != s[0].size())
      fail("the index " + shape_str(s[1]) + " must have as many dims as x " + shape_str(s[0]));
    for (size_t i = 0; i < s[0].size(); ++i)
      if (i != d && s[1][i] > s[0][i])
        fail("the index " + shape_str(s[1]) + " is larger than x " + shape_str(s[0]) + " on dim " + std::to_string(i) +
             " (only dim " + std::to_string(d) + " may be)");
    return s[1];
  }
  if (family == "scatter") {  // scatter, scatter_add, index_add: dim of x (wrapped above); x's shape
    const auto d = static_cast<size_t>(*a.dim);
    if (op == "index_add") {
      if (s[1].size() != 1) fail("the index must be 1-D, got " + shape_str(s[1]));
      Shape want = s[0];
      want[d] = s[1][0];
      if (s[2] != want)
        fail("the source " + shape_str(s[2]) + " must be x " + shape_str(s[0]) + " with the index's length " +
             std::to_string(s[1][0]) + " on dim " + std::to_string(d) + ": " + shape_str(want));
      return s[0];
    }
    if (s[1].size() != s[0].size())
      fail("the index " + shape_str(s[1]) + " must have as many dims as x " + shape_str(s[0]));
    if (s[2] != s[1]) fail("src " + shape_str(s[2]) + " must have the index's shape " + shape_str(s[1]));
    for (size_t i = 0; i < s[0].size(); ++i)
      if (i != d && s[1][i] > s[0][i])
        fail("the index " + shape_str(s[1]) + " is larger than x " + shape_str(s[0]) + " on dim " + std::to_string(i) +
             " (only dim " + std::to_string(d) + " may be)");
    return s[0];
  }
  if (family == "pick_target") {
    if (s[0].size() != 2 || s[1].size() != 1 || s[1][0] != s[0][0])
      fail("needs log_probs [N, C] and a target [N], got " + shape_str(s[0]) + " and " + shape_str(s[1]));
    return {s[0][0]};
  }
  if (family == "norm") {
    const auto& ns = a.normalized_shape;
    const auto k = static_cast<int64_t>(ns.size());
    if (s.size() > 3) fail("takes x, weight and bias, got " + std::to_string(s.size()) + " operands");
    if (k == 0 || k > rank || !std::equal(ns.begin(), ns.end(), s[0].end() - k))
      fail("normalized_shape " + shape_str(ns) + " is not the trailing dims of " + shape_str(s[0]));
    for (size_t i = 1; i < s.size(); ++i)
      if (s[i] != ns) fail((i == 1 ? "the weight " : "the bias ") + shape_str(s[i]) + " is not normalized_shape " + shape_str(ns));
    return s[0];
  }
  if (family == "compare") return broadcast_shapes(op, s);  // pointwise, one operand or two
  if (family == "select" || family == "select_index") {
    Shape out = s[0];
    const int64_t n = out[*a.dim];
    if (op == "topk") {
      if (a.k < 0 || a.k > n)
        fail("k " + std::to_string(a.k) + " out of range for dim " + std::to_string(*a.dim) + " of " + shape_str(s[0]));
      out[*a.dim] = a.k;
    } else if (op != "sort" && op != "argsort") {  // max, min, argmax, argmin: the dim reduced
      if (n == 0) fail("dim " + std::to_string(*a.dim) + " of " + shape_str(s[0]) + " is empty (no element to pick)");
      if (a.keepdim) out[*a.dim] = 1;
      else out.erase(out.begin() + *a.dim);
    }
    return out;
  }
  if (family == "item") {  // the one element's number, 0-d
    if (numel(s[0]) != 1) fail("a value of one element has a number, got " + shape_str(s[0]) + " (" + std::to_string(numel(s[0])) + " elements)");
    return {};
  }
  if (family == "one_hot") {  // a new trailing dim of num_classes
    if (a.num_classes < 1) fail("num_classes must be at least 1, got " + std::to_string(a.num_classes));
    Shape out = s[0];
    out.push_back(a.num_classes);
    return out;
  }
  if (family == "bincount") {  // minlength bins (every value below it: checked on the data)
    if (rank != 1) fail("needs 1-D values, got " + shape_str(s[0]));
    if (a.minlength < 1) fail("minlength must be at least 1, got " + std::to_string(a.minlength));
    return {a.minlength};
  }
  if (family == "triangle" && rank < 2) fail("needs at least 2 dims, got " + shape_str(s[0]));
  if (f.arity >= 2) return broadcast_shapes(op, s);  // pointwise
  if (family == "transpose") {
    Shape out = s[0];
    std::swap(out[a.dim0], out[a.dim1]);
    return out;
  }
  if (family == "permute") {
    Shape out;
    for (int64_t d : a.dims) out.push_back(s[0][d]);
    return out;
  }
  if (family == "reduction" || family == "amax" || family == "amin" || family == "vector_norm") {
    Shape out;
    for (int64_t d = 0; d < rank; ++d) {
      if (!reduces(a, d)) out.push_back(s[0][d]);
      else if (a.keepdim) out.push_back(1);
    }
    return out;
  }
  if (family == "cat" || family == "stack") {
    Shape out = s[0];
    for (size_t i = 1; i < s.size(); ++i) {
      bool fits = s[i].size() == s[0].size();
      for (int64_t d = 0; fits && d < rank; ++d) fits = family == "stack" || d == *a.dim ? true : s[i][d] == s[0][d];
      if (family == "stack") fits = fits && s[i] == s[0];
      if (!fits) fail("operand shapes differ: " + shape_str(s[0]) + " and " + shape_str(s[i]));
      if (family == "cat") out[*a.dim] += s[i][*a.dim];
    }
    if (family == "stack") out.insert(out.begin() + *a.dim, static_cast<int64_t>(s.size()));
    return out;
  }
  if (family == "narrow") {
    const int64_t n = s[0][*a.dim];
    const int64_t start = a.start < 0 ? a.start + n : a.start;
    if (start < 0 || start > n || a.length < 0 || start + a.length > n)
      fail("start " + std::to_string(a.start) + " and length " + std::to_string(a.length) + " out of range for dim " +
           std::to_string(*a.dim) + " of " + shape_str(s[0]));
    Shape out = s[0];
    out[*a.dim] = a.length;
    return out;
  }
  if (family == "expand") {
    if (a.shape.size() < s[0].size()) fail("shape " + shape_str(a.shape) + " has fewer dims than " + shape_str(s[0]));
    Shape out = a.shape;
    const size_t lead = out.size() - s[0].size();
    for (size_t i = 0; i < out.size(); ++i) {
      const int64_t have = i < lead ? -2 : s[0][i - lead];
      if (out[i] == -1) {
        if (i < lead) fail("-1 in a new leading dim of " + shape_str(a.shape));
        out[i] = have;
      } else if (out[i] < 0) {
        fail("negative extent in " + shape_str(a.shape));
      } else if (i >= lead && have != out[i] && have != 1) {
        fail("cannot expand " + shape_str(s[0]) + " to " + shape_str(a.shape) + " (dim " + std::to_string(i - lead) + ")");
      }
    }
    return out;
  }
  if (family == "view") {
    const int64_t count = numel(s[0]);
    if (op == "view" || op == "reshape") return filled(op, a.shape, count, s[0]);
    if (op == "flatten") {
      if (rank == 0) return {1};
      Shape out(s[0].begin(), s[0].begin() + a.start_dim);
      int64_t merged = 1;
      for (int64_t d = a.start_dim; d <= a.end_dim; ++d) merged *= s[0][d];
      out.push_back(merged);
      out.insert(out.end(), s[0].begin() + a.end_dim + 1, s[0].end());
      return out;
    }
    if (op == "unflatten") {
      Shape sizes = filled(op, a.sizes, s[0][*a.dim], s[0]);
      Shape out(s[0].begin(), s[0].begin() + *a.dim);
      out.insert(out.end(), sizes.begin(), sizes.end());
      out.insert(out.end(), s[0].begin() + *a.dim + 1, s[0].end());
      return out;
    }
    if (op == "unsqueeze") {
      Shape out = s[0];
      out.insert(out.begin() + *a.dim, 1);
      return out;
    }
    if (op == "squeeze") {
      Shape out;
      for (int64_t d = 0; d < rank; ++d)
        if (s[0][d] != 1 || (a.dim && *a.dim != d)) out.push_back(s[0][d]);
      return out;
    }
  }
  return s[0];  // pointwise unary, softmax
}

}  // namespace meshsim
