#include "sim/interpreter.h"

#include "core/error.h"
#include "sim/data.h"
#include "sim/local_map.h"
#include "sim/local_ops.h"

namespace meshsim {

std::vector<DTensor> make_inputs(const Scenario& sc, const RunOptions& options,
                                 std::map<std::string, at::Tensor>& globals) {
  std::vector<DTensor> out;
  for (size_t i = 0; i < sc.inputs.size(); ++i) {
    const InputDecl& in = sc.inputs[i];
    Rng rng(options.seed, i);
    DTensor t{in.name, in.shape, in.placements, {}};
    if (in.from_local) {
      at::Tensor local = make_init(in.init, in.shape, options.dtype, rng);
      t.locals.assign(static_cast<size_t>(sc.mesh.size()), local);
      at::Tensor global = assemble(sc.mesh, in.placements, t.locals);
      t.shape = global.sizes().vec();
      globals[in.name] = global;
    } else {
      at::Tensor global = make_init(in.init, in.shape, options.dtype, rng);
      t.locals = distribute(sc.mesh, in.placements, global, &rng);
      globals[in.name] = global;
    }
    for (auto& l : t.locals) l = l.detach().requires_grad_(in.requires_grad);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<DTensor> run_local_map(Runtime& rt, const OpDecl& op, const std::vector<DTensor>& args) {
  BodyContext ctx(rt);
  std::map<std::string, LTensor> env;
  for (size_t i = 0; i < args.size(); ++i) {
    const DTensor& a = args[i];
    // A negative dim counts from the end of the arg's dims (the runtime reports one out of range).
    Spec want = op.in_placements.empty() ? a.spec : op.in_placements[i];
    if (!op.in_placements.empty()) {
      try {
        want = normalize_spec(want, static_cast<int64_t>(a.shape.size()));
      } catch (const std::invalid_argument&) {
      }
    }
    const bool move = want != a.spec;
    env[op.args[i]] = ctx.enter(move ? rt.redistribute(a, want, op.out + ".in" + std::to_string(i)) : a);
  }
  for (const auto& b : op.body) {
    if (is_split_op(b.op)) {  // one narrow per piece (body values are rank-local: the local shape)
      const LTensor& x = env.at(b.args.at(0));
      const auto pieces = split_as_narrows(b, x.locals.at(0).sizes().vec());
      for (size_t k = 0; k < pieces.size(); ++k)
        env[b.outs[k]] = ctx.op("narrow", {{"dim", *pieces[k].dim}, {"start", pieces[k].start}, {"length", pieces[k].length}},
                                {x}, b.outs[k]);
      continue;
    }
    env[b.out] = ctx.run(b, env);
  }
  std::vector<DTensor> outs;
  for (size_t k = 0; k < op.returns.size(); ++k) outs.push_back(ctx.leave(env.at(op.returns[k]), op.out_placements[k], op.outs[k]));
  return outs;
}

namespace {

// A binary op's scalar `value` as an operand: a 0-d tensor replicated on every axis (no gradient).
DTensor scalar_operand(Runtime& rt, double value, const at::Tensor& like, const std::string& name) {
  const Mesh& mesh = rt.mesh();
  at::Tensor v = at::scalar_tensor(value, like.options().requires_grad(false));
  return DTensor{name, {}, Spec(static_cast<size_t>(mesh.ndim()), Placement::replicate()),
                 Locals(static_cast<size_t>(mesh.size()), v)};
}

}  // namespace

// One DTensor op of the program. A binary op with a `value` takes it as a replicated 0-d operand;
// linear runs as transpose, matmul and add (PyTorch decomposes aten.linear likewise), each with
// its own rule row and event ("y.weight_t", "y.matmul").
DTensor apply_program_op(Runtime& rt, const OpDecl& op, const std::vector<DTensor>& args) {
  OpAttrs attrs = op_attrs(op);
  if (attrs.scalar && args.size() == 1) {
    attrs.scalar = false;
    return rt.apply_op(op.op, attrs, {args[0], scalar_operand(rt, attrs.value, args[0].locals.at(0), op.out + ".value")},
                       op.out);
  }
  if (op.op == "linear") {
    OpAttrs t;
    t.dim0 = 0;
    t.dim1 = 1;
    if (args.at(1).shape.size() != 2)
      throw SemanticError(ErrorKind::ShapeMismatch, "linear: the weight must be 2-D, got " + shape_str(args[1].shape));
    const DTensor wt = rt.apply_op("transpose", t, {args[1]}, op.out + ".weight_t");
    if (args.size() == 2) return rt.apply_op("matmul", {}, {args[0], wt}, op.out);
    const DTensor y = rt.apply_op("matmul", {}, {args[0], wt}, op.out + ".matmul");
    return rt.apply_op("add", {}, {y, args[2]}, op.out);
  }
  return rt.apply_op(op.op, attrs, args, op.out);
}

SimRun run_distributed(const Scenario& sc, const RunOptions& options) {
  SimRun run;
  run.runtime = std::make_unique<Runtime>(sc.mesh, options);
  Runtime& rt = *run.runtime;
  std::vector<DTensor> inputs = make_inputs(sc, options, run.input_globals);
  std::vector<DTensor> grad_leaves;
  for (const auto& t : inputs) {
    Event e = rt.make_event("input", "input", t.name, t.locals);
    e.out_spec = spec_str(t.spec);
    rt.recorder().add(std::move(e));
    run.named.push_back(t.name);
    run.values[t.name] = t;
    if (sc.find_input(t.name)->requires_grad) {
      run.grad_inputs.push_back(t.name);
      grad_leaves.push_back(t);
    }
  }
  for (const auto& op : sc.program) {
    std::vector<DTensor> args;
    for (const auto& a : op.args) args.push_back(run.values.at(a));
    if (op.op == "local_map") {
      std::vector<DTensor> outs = run_local_map(rt, op, args);
      for (size_t k = 0; k < outs.size(); ++k) {
        run.named.push_back(op.outs[k]);
        run.values[op.outs[k]] = std::move(outs[k]);
      }
      run.has_local_map = true;
      continue;
    }
    if (is_split_op(op.op)) {  // one narrow per piece, each its own value
      const auto pieces = split_as_narrows(op, args.at(0).shape);
      for (size_t k = 0; k < pieces.size(); ++k) {
        run.named.push_back(op.outs[k]);
        run.values[op.outs[k]] = rt.apply_op("narrow", pieces[k], {args[0]}, op.outs[k]);
      }
      continue;
    }
    DTensor out;
    if (op.op == "redistribute") {
      Spec to;
      for (const auto& p : op.attrs.at("placements")) to.push_back(parse_placement(p.get<std::string>()));
      out = rt.redistribute(args.at(0), to, op.out);
    } else {
      out = apply_program_op(rt, op, args);
    }
    run.named.push_back(op.out);
    run.values[op.out] = std::move(out);
  }
  if (!sc.backward.empty()) {
    auto grads = rt.backward(run.values.at(sc.backward), grad_leaves);
    for (size_t i = 0; i < grad_leaves.size(); ++i) {
      run.grads[grad_leaves[i].name] = grads[i];
      if (auto gs = rt.input_grad_spec(grad_leaves[i].name, grad_leaves[i].spec)) run.grad_specs[grad_leaves[i].name] = *gs;
    }
    run.ran_backward = true;
  }
  return run;
}

}  // namespace meshsim
