// function_backward_matches_reference: each registered Function's backward, on its own.
//
// A Function a local_map body calls brings its own backward, which the runtime trusts; the
// differential properties only see it where a generator happens to call the Function inside a
// program. Here every registered Function (sim/builtin_functions.cpp's and the user's, those of a
// `--plugin` included: the registry is iterated) is run alone on a one-rank mesh, where its
// collectives are identities and its global computation is its local one, and the gradient its
// backward gives is compared, element by element, with central finite differences of its
// `reference` (the same computation on global tensors) at the same inputs.
//
// One case: a Function drawn from the registry (one without a reference is skipped: a discard),
// as many inputs as its signature says (1-3 for "any"), all of one shape of 1-3 dims of 1-4
// elements, float64 values of magnitude 0.17 to 2.04 that are never 0 nor a multiple of 1/8 (no
// kink of abs, relu or a clamp at a round number is met), and a cotangent of the output's shape
// (nonzero, multiples of 1/4) per output. The loss is the sum over the outputs of
// sum(output * cotangent); its gradient by the backward
// must equal, per element, (sum((ref(x + h e) - ref(x - h e)) * cotangent)) / 2h (summed over outputs) within 1e-6
// relative to max(1, |value|), h = 1e-6 * max(1, |x|). A failure says which Function, which input,
// which element, both numbers, and the factor when the backward is a constant multiple.
#include "properties/function_backward.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <rapidcheck.h>
#include <torch/csrc/autograd/autograd.h>

#include "core/mutants.h"
#include "properties/properties.h"
#include "properties/runner.h"
#include "sim/local_map.h"
#include "sim/runtime.h"

namespace meshsim {

namespace {

constexpr double kTolerance = 1e-6;  // relative to max(1, |expected|)
constexpr double kStep = 1e-6;       // relative to max(1, |x|)
const char* const kAxis = "a";       // the one-rank mesh's axis, the one a communicating call names

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string shape_str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

// The index of a flat (row-major) element, as [i, j, ...].
std::string index_str(int64_t flat, at::IntArrayRef shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return shape_str(idx);
}

std::string values_str(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const double* p = c.data_ptr<double>();
  std::string s = "[";
  for (int64_t k = 0; k < c.numel(); ++k) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", p[k]);
    s += (k ? ", " : "") + std::string(buf);
  }
  return s + "]";
}

at::Tensor from_values(const std::vector<double>& v, const std::vector<int64_t>& shape) {
  return at::tensor(v, at::kDouble).reshape(shape).contiguous();
}

// Inputs: +-(k + 1/pi) / 8, k in 1..16: away from 0 and from every multiple of 1/8.
at::Tensor draw_input(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const int k = *rc::gen::inRange(1, 17);
    const bool negative = *rc::gen::arbitrary<bool>();
    x = (negative ? -1.0 : 1.0) * (k + 0.3183098861837907) / 8.0;
  }
  return from_values(v, shape);
}

// A cotangent: +-k / 4, k in 1..8 (never 0, so that a wrong gradient cannot hide behind it).
at::Tensor draw_cotangent(at::IntArrayRef shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const int k = *rc::gen::inRange(1, 9);
    x = (*rc::gen::arbitrary<bool>() ? -1.0 : 1.0) * k / 4.0;
  }
  return from_values(v, shape.vec());
}

struct Forward {
  std::vector<at::Tensor> outputs;  // one per output of the Function
  std::vector<at::Tensor> leaves;
  std::optional<Runtime> runtime;
};

// The Function's gradient of the sum over its outputs of sum(output * cotangent) for each input, by
// its own backward; an undefined tensor where no gradient reached the input.
std::vector<at::Tensor> backward_grads(Forward& f, const std::vector<at::Tensor>& cotangents, const std::string& name) {
  std::vector<at::Tensor> grads(f.leaves.size());
  at::Tensor loss;
  for (size_t k = 0; k < f.outputs.size(); ++k)
    if (f.outputs[k].requires_grad()) {
      const at::Tensor term = (f.outputs[k] * cotangents[k]).sum();
      loss = loss.defined() ? loss + term : term;
    }
  if (!loss.defined()) return grads;
  std::string raised;
  try {
    grads = torch::autograd::grad({loss}, f.leaves, {}, false, false, /*allow_unused=*/true);
  } catch (const std::exception& e) {
    raised = e.what();
  }
  if (!raised.empty()) RC_FAIL(name + ": its backward raised: " + raised);
  if (f.runtime->pending_error_) RC_FAIL(name + ": its backward raised: " + f.runtime->pending_error_->what());
  return grads;
}

// What went wrong with one input's gradient, in numbers; "" when it matches.
std::string compare_input(size_t i, const at::Tensor& input, const std::vector<double>& expected,
                          const at::Tensor& grad) {
  const bool none = !grad.defined();
  const at::Tensor g = none ? at::zeros_like(input) : grad.to(at::kDouble).contiguous();
  if (g.sizes() != input.sizes())
    return "input " + std::to_string(i) + ": the backward's gradient has shape " + shape_str(g.sizes()) +
           ", the input " + shape_str(input.sizes());
  const double* actual = g.data_ptr<double>();
  const int64_t n = input.numel();
  int64_t bad = 0, first = -1;
  for (int64_t k = 0; k < n; ++k) {
    const double e = expected[static_cast<size_t>(k)], a = actual[k];
    if (!(std::abs(a - e) <= kTolerance * std::max(1.0, std::abs(e)))) {
      ++bad;
      if (first < 0) first = k;
    }
  }
  if (bad == 0) return "";
  std::string s = "input " + std::to_string(i) + " (shape " + shape_str(input.sizes()) + "): " +
                  std::to_string(bad) + " of " + std::to_string(n) + " elements differ; element " +
                  index_str(first, input.sizes()) + ": expected " + num(expected[static_cast<size_t>(first)]) +
                  " (central differences of the reference), actual " + num(actual[first]) + " (the backward" +
                  (none ? ": no gradient reached the input)" : ")");
  // A constant factor: every element whose expected value is not ~0 has the same ratio, and those
  // whose expected value is ~0 are ~0 too.
  std::optional<double> factor;
  bool constant = !none;
  for (int64_t k = 0; k < n && constant; ++k) {
    const double e = expected[static_cast<size_t>(k)], a = actual[k];
    if (std::abs(e) <= kTolerance) {
      constant = std::abs(a) <= kTolerance;
      continue;
    }
    const double r = a / e;
    if (!factor)
      factor = r;
    else
      constant = std::abs(r - *factor) <= kTolerance * std::max(1.0, std::abs(*factor));
  }
  if (constant && factor) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", *factor);
    s += "; the backward is " + std::string(buf) + " times the finite differences on every element of input " +
         std::to_string(i) + " (" + std::to_string(n) + (n == 1 ? " element)" : " elements)");
  }
  return s;
}

}  // namespace

void function_backward_matches_reference() {
  const std::vector<std::string> names = scenario_function_names();
  RC_ASSERT(!names.empty());
  const std::string name = *rc::gen::resize(100, rc::gen::elementOf(names));
  const FunctionReference* reference = find_function_reference(name);
  if (!reference) RC_DISCARD(name + " has no reference: skipped");
  const FunctionInvoker* invoker = find_scenario_function(name);
  RC_ASSERT(invoker != nullptr);
  const FunctionSignature signature = scenario_function_signature(name);
  const int arity = signature.arity >= 0 ? signature.arity : *rc::gen::inRange(1, 4);
  if (arity == 0) RC_DISCARD(name + " takes no argument: nothing to differentiate");

  std::vector<int64_t> shape(static_cast<size_t>(*rc::gen::inRange(1, 4)));
  for (auto& d : shape) d = *rc::gen::inRange<int64_t>(1, 5);
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < arity; ++i) inputs.push_back(draw_input(shape));
  // For the report: the one-rank mesh, each input replicated there.
  note_case_layout(Mesh({kAxis}, {1}),
                   std::vector<std::pair<Shape, Spec>>(static_cast<size_t>(arity), {shape, Spec{Placement::replicate()}}));

  // The call as a scenario writes it: the op object, with the mesh axis a communicating call names
  // (a rank-local Function ignores it, as it is meshsim's field).
  std::vector<std::string> outs = {"y"};
  for (int k = 1; k < signature.outputs; ++k) outs.push_back("y" + std::to_string(k));
  nlohmann::json attrs = {{"op", "call"}, {"function", name}, {"args", nlohmann::json::array()}};
  attrs["out"] = outs.size() == 1 ? nlohmann::json(outs[0]) : nlohmann::json(outs);
  for (int i = 0; i < arity; ++i) attrs["args"].push_back("x" + std::to_string(i));
  attrs["axis"] = kAxis;

  // The Function on a one-rank mesh, plain local code (its own forward and backward only), with
  // the check run's planted bug on.
  Forward f;
  std::vector<at::Tensor> cotangents;
  std::vector<at::Tensor> grads;
  {
    MutantScope planted(parse_mutant(planted_mutant()));
    f.runtime.emplace(Mesh({kAxis}, {1}), RunOptions{});
    BodyContext ctx(*f.runtime, /*checked=*/false);
    std::vector<LTensor> args;
    for (int i = 0; i < arity; ++i) {
      f.leaves.push_back(inputs[static_cast<size_t>(i)].clone().requires_grad_(true));
      LTensor x;
      x.name = "x" + std::to_string(i);
      x.mesh = &f.runtime->mesh();
      x.locals = {f.leaves.back()};
      x.unchecked = true;  // plain local code, as the context runs it
      args.push_back(std::move(x));
    }
    OpDecl op;
    op.out = outs[0];
    op.outs = outs;
    op.op = "call";
    op.args = attrs["args"].get<std::vector<std::string>>();
    op.attrs = attrs;
    op.path = "function_backward_matches_reference/" + name;
    std::string refused;
    try {
      for (const auto& y : (*invoker)(ctx, args, op)) f.outputs.push_back(y.locals.at(0));
    } catch (const std::exception& e) {
      refused = e.what();
    }
    if (!refused.empty()) RC_DISCARD(name + " refused inputs of shape " + shape_str(shape) + ": " + refused);
    for (const auto& y : f.outputs)
      if (!y.defined() || y.scalar_type() != at::kDouble)
        RC_DISCARD(name + " gives an output that is not float64: nothing to differentiate");
    for (const auto& y : f.outputs) cotangents.push_back(draw_cotangent(y.sizes()));
    grads = backward_grads(f, cotangents, name);
  }

  // Central differences of the reference (the truth: no planted bug, no autograd).
  at::NoGradGuard no_grad;
  auto run_reference = [&](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    std::string raised;
    try {
      std::vector<at::Tensor> ys = (*reference)(xs, attrs);
      if (ys.size() != f.outputs.size())
        raised = "it returned " + std::to_string(ys.size()) + " tensors for " + std::to_string(f.outputs.size()) + " outputs";
      for (auto& y : ys) y = y.to(at::kDouble);
      if (raised.empty()) return ys;
    } catch (const std::exception& e) {
      raised = e.what();
    }
    RC_FAIL(name + ": its reference raised on inputs its forward accepted (shape " + shape_str(shape) + "): " + raised);
    return {};
  };
  const std::vector<at::Tensor> at_x = run_reference(inputs);
  double forward_gap = 0.0;
  for (size_t k = 0; k < at_x.size(); ++k) {
    if (at_x[k].sizes() != f.outputs[k].sizes())
      RC_FAIL(name + ": output " + std::to_string(k) + " of its forward has shape " + shape_str(f.outputs[k].sizes()) +
              ", of its reference " + shape_str(at_x[k].sizes()));
    if (at_x[k].numel())
      forward_gap = std::max(forward_gap, (f.outputs[k].detach() - at_x[k]).abs().max().item<double>());
  }

  std::vector<std::string> problems;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& x = inputs[i];
    const double* v = x.data_ptr<double>();
    std::vector<double> expected(static_cast<size_t>(x.numel()));
    for (int64_t k = 0; k < x.numel(); ++k) {
      const double h = kStep * std::max(1.0, std::abs(v[k]));
      const double up = v[k] + h, down = v[k] - h;
      std::vector<at::Tensor> plus = inputs, minus = inputs;
      plus[i] = x.clone();
      minus[i] = x.clone();
      plus[i].data_ptr<double>()[k] = up;
      minus[i].data_ptr<double>()[k] = down;
      // The difference first, so that the elements the step does not move cancel exactly.
      const std::vector<at::Tensor> ys_plus = run_reference(plus), ys_minus = run_reference(minus);
      double sum = 0.0;
      for (size_t o = 0; o < ys_plus.size(); ++o) sum += ((ys_plus[o] - ys_minus[o]) * cotangents[o]).sum().item<double>();
      expected[static_cast<size_t>(k)] = sum / (up - down);
    }
    const std::string problem = compare_input(i, x, expected, grads[i]);
    if (!problem.empty()) problems.push_back(problem);
  }
  if (problems.empty()) return;

  // Lines after the first are indented to sit under the report's "why: " (RapidCheck adds 2).
  const std::string nl = "\n           ";
  std::ostringstream why;
  why << "Function " << name << ": its backward differs from central differences of its reference";
  for (const auto& p : problems) why << nl << p;
  for (size_t i = 0; i < inputs.size(); ++i)
    why << nl << "drawn: input " << i << " " << shape_str(inputs[i].sizes()) << " = " << values_str(inputs[i]);
  for (size_t k = 0; k < cotangents.size(); ++k)
    why << nl << "drawn: cotangent" << (cotangents.size() > 1 ? " of output " + std::to_string(k) : std::string()) << " "
        << shape_str(cotangents[k].sizes()) << " = " << values_str(cotangents[k]);
  why << nl << "its forward " << (forward_gap <= kTolerance ? "matches" : "differs from") << " its reference (max |difference| "
      << num(forward_gap) << ")";
  RC_FAIL(why.str());
}

}  // namespace meshsim
