// The logical view (see render.h): a "forward" cluster with the values, ops and the steps of every
// redistribution on the path from its operand, a "backward" cluster with the gradient flow.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "traces/render_common.h"

namespace meshsim::render_detail {

namespace {

class Logical {
 public:
  Logical(const Trace& trace, const Facts& facts, const Collapse& collapse) : f_(facts), c_(collapse) {
    for (size_t i = 0; i < trace.events.size(); ++i) {
      fold_ = c_.at(i);
      add(trace.events[i]);
    }
    // Steps no op consumed, in event order.
    std::vector<const Event*> left;
    for (const auto& [value, chain] : pending_) left.insert(left.end(), chain.begin(), chain.end());
    std::sort(left.begin(), left.end(), [](const Event* a, const Event* b) { return a->seq < b->seq; });
    for (const Event* step : left) {
      fold_ = c_.at(static_cast<size_t>(step - trace.events.data()));
      step_node(*step);
    }
    fold_ = -1;
  }

  std::string body() const {
    std::string forward = forward_;
    for (size_t k = 0; k < bodies_.size(); ++k) {
      forward += cluster("local_map" + std::to_string(k),
                         {{"label", html_value(font(bold("local_map"), "#6a51a3", 11))},
                          {"labeljust", "l"},
                          {"tooltip", "a local_map body: its values are LTensors, with variant / reduced mesh axes"},
                          {"style", "rounded,dashed,filled"},
                          {"fillcolor", "#faf7fd"},
                          {"color", "#8c6bb1"}},
                         bodies_[k], "    ");
    }
    std::string out;
    out += cluster("forward",
                   {{"label", "forward"}, {"labeljust", "l"}, {"style", "rounded"}, {"color", "#a8a8a8"},
                    {"fontcolor", kGray}},
                   forward);
    out += cluster("backward",
                   {{"label", "backward"}, {"labeljust", "l"}, {"style", "rounded,dashed"}, {"color", "#a8a8a8"},
                    {"fontcolor", kGray}},
                   backward_);
    return out + edges_;
  }

 private:
  void add(const Event& e) {
    const bool forward = e.phase == "forward";
    if (e.kind == "collective" || e.kind == "local") return forward ? forward_step(e) : backward_step(e);
    if (forward) return e.kind == "input" ? void(value(e, Role::Input)) : op(e);
    if (e.kind == "seed") return seed(e);
    if (e.kind == "input_grad") return input_grad(e);
    grad(e);
  }

  // Forward nodes go to the local_map body being drawn, if any.
  std::string& forward_body() { return in_body_ ? bodies_.back() : forward_; }

  // ---- forward: values, ops, and the steps of each redistribution on the path from its operand

  // A forward step is drawn when an op consumes it, in the cluster of that op.
  void forward_step(const Event& e) {
    out_edge_[event_id(e)] = step_out_edge(e, true);
    pending_[e.value].push_back(&e);
  }
  void step_node(const Event& e, const std::string& as_op = "") {
    std::string label = step_label(e);
    if (!as_op.empty()) label += kBr + small("as " + as_op);
    node(forward_body(), event_id(e), step_attrs(e.name, label, tooltip(e)));
  }

  void op(const Event& e) {
    if (e.name == "enter_local_map" && !in_body_) {
      bodies_.emplace_back();
      in_body_ = true;
    }
    if (e.name == "leave_local_map") in_body_ = false;
    if (e.name == "redistribute") {
      const auto chain = take(e.value);
      const std::string src = value_ref(e.args.empty() ? "" : e.args.front());
      const std::string id = value(e, is_implicit(e.value) ? Role::Implicit : Role::Value);
      if (chain.empty()) {
        edge(src, id, {{"xlabel", " redistribute \n (no data moved) "}, {"fontcolor", kGray}});
      } else {
        draw_chain(src, chain, id);
      }
      return;
    }
    // Steps recorded under this op's own value (a collective inside a local_map body, or older
    // traces): they start from the operand whose spec is the chain's source spec.
    const auto own = take(e.value);
    const std::string via = own.empty() ? "" : chained_arg(e, *own.front());
    // An op that only wraps its collective ("all_gather_to_reduced" after an all_gather step) is
    // drawn as that step.
    if (!own.empty() && e.name.compare(0, own.back()->name.size(), own.back()->name) == 0 &&
        is_collective_name(own.back()->name)) {
      const std::string src = value_ref(via);
      std::vector<std::string> others;
      for (const auto& arg : e.args)
        if (arg != via) others.push_back(value_ref(arg));
      const std::string id = value(e, is_implicit(e.value) ? Role::Implicit : Role::Value);
      draw_chain(src, own, id, e.name == own.back()->name ? "" : e.name);
      for (const auto& other : others) edge(other, id);
      return;
    }
    // An op that is itself a collective (an LTensor collective in a local_map body).
    std::string label = bold(drawn_name(f_, e));
    Attrs attrs;
    if (is_collective_name(e.name)) {
      const StepStyle& s = step_style(e.name);
      label = font(bold(e.name), s.line) + (e.axis.empty() ? "" : " " + font(esc(e.axis), kGray));
      for (const auto& line : rule_lines(e, f_.mesh)) label += kBr + small(line);
      attrs = step_attrs(e.name, label, tooltip(e));
      if (e.bytes > 0) out_edge_[event_id(e)] = step_out_edge(e, true);
    } else {
      for (const auto& line : rule_lines(e, f_.mesh)) label += kBr + small(line);
      Attrs tip = tooltip(e);
      if (auto src = f_.sources.find(e.value); src != f_.sources.end()) {  // imported: the user's line
        label += kBr + small(esc(src->second.where));
        if (tip.empty()) tip = {{"tooltip", src->second.detail}};
      }
      attrs = node_attrs(Role::Op, label, false, tip);
    }
    node(forward_body(), event_id(e), attrs);

    for (const auto& arg : e.args) {
      if (!own.empty() && arg == via) {
        draw_chain(value_ref(arg), own, event_id(e));
        continue;
      }
      const auto chain = take(arg);
      if (!chain.empty()) {  // an implicit operand moved below autograd, inside the op
        std::string src = chain.front()->args.empty() ? implicit_source(f_, arg) : chain.front()->args.front();
        draw_chain(value_ref(src), chain, event_id(e));
        continue;
      }
      edge(value_ref(arg), event_id(e));
    }
    if (!own.empty() && via.empty()) draw_chain("", own, event_id(e));
    edge(event_id(e), value(e, is_implicit(e.value) ? Role::Implicit : Role::Value));
  }

  // Draws the value an event produces; returns its node id ("v:x", or "v:x@5" when the name was
  // drawn before, as a local_map's LTensor takes its argument's name).
  std::string value(const Event& e, Role role) {
    const bool ltensor = is_ltensor_spec(e.out_spec);
    std::string label = bold(e.value);
    auto it = f_.global_shape.find(e.value);
    if (it != f_.global_shape.end() && !ltensor) label += "  " + font(esc(shape_str(it->second)), kGray, 10);
    if (ltensor && !e.local_shapes.empty()) label += "  " + font(esc("local " + local_shapes_str(e)), kGray, 9);
    label += kBr + mono(e.out_spec);
    if (role == Role::Implicit) label += kBr + small(implicit_text(f_, e.value));
    if (!ltensor && !e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    auto errors = f_.value_errors.find(e.value);
    const bool failing = errors != f_.value_errors.end() && (!ltensor || !f_.dtensor_values.count(e.value));
    if (failing) label += error_lines(errors->second);
    const std::string id = current_.count(e.value) ? value_id(e.value) + "@" + std::to_string(e.seq) : value_id(e.value);
    node(forward_body(), id, node_attrs(role, label, failing));
    current_[e.value] = id;
    spec_of_[e.value] = e.out_spec;
    return id;
  }

  // The node of a forward value; a value the trace never produced gets a gray stand-in.
  std::string value_ref(const std::string& name) {
    if (name.empty()) return "";
    auto it = current_.find(name);
    if (it != current_.end()) return it->second;
    node(forward_, value_id(name), node_attrs(Role::Ghost, esc(name) + kBr + small(f_.ghost_note, kLightGray)));
    return current_[name] = value_id(name);
  }

  std::vector<const Event*> take(const std::string& value) { return take_pending(pending_, value); }

  std::string chained_arg(const Event& op, const Event& first_step) const {
    for (const auto& arg : op.args) {
      auto it = spec_of_.find(arg);
      if (it != spec_of_.end() && !first_step.in_specs.empty() && it->second == first_step.in_specs[0]) return arg;
    }
    return op.args.empty() ? "" : op.args.front();
  }

  // Draws the steps of a chain and the edges from `from` through them to `to`.
  void draw_chain(const std::string& from, const std::vector<const Event*>& chain, const std::string& to,
                  const std::string& last_as_op = "") {
    std::string prev = from;
    for (const Event* step : chain) {
      step_node(*step, step == chain.back() ? last_as_op : "");
      if (!prev.empty()) edge(prev, event_id(*step));
      prev = event_id(*step);
    }
    if (!prev.empty()) edge(prev, to);
  }

  // ---- backward: every node that moves a value's gradient consumes the nodes holding it so far

  void seed(const Event& e) {
    std::string label = bold("grad " + e.value) + " " + small("seed" + (e.name.empty() ? "" : ": " + e.name)) + kBr +
                        mono(e.out_spec);
    if (!e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    node(backward_, event_id(e), node_attrs(Role::Seed, label));
    auto it = current_.find(e.value);
    if (it != current_.end()) edge(it->second, event_id(e), {{"style", "dotted"}, {"color", "#969696"}});
    grad_heads_[e.value] = {event_id(e)};
    seed_id_ = event_id(e);
  }

  void grad(const Event& e) {
    std::string label = bold("grad " + e.value) + " " + small("from " + e.name + " backward") + kBr + mono(e.out_spec);
    if (!e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    node(backward_, event_id(e), node_attrs(Role::Grad, label, false, tooltip(e)));
    if (!e.args.empty()) consume(e.args.front(), event_id(e));
    grad_heads_[e.value].push_back(event_id(e));
    remember(e, e.value);
  }

  // A step moves the gradient of args[0] (of its value when it has no args). It continues the
  // event just before it when that one produced the same gradient (a chain of steps, or a hook
  // after its contribution); otherwise it starts from the nodes holding its value's gradient.
  void backward_step(const Event& e) {
    const std::string id = event_id(e);
    node(backward_, id, step_attrs(e.name, step_label(e), tooltip(e)));
    out_edge_[id] = step_out_edge(e, true);
    const std::string grad_of = e.args.empty() ? e.value : e.args.front();
    if (!last_grad_id_.empty() && last_grad_of_ == grad_of && last_seq_ + 1 == e.seq) {
      backward_edge(last_grad_id_, id);
      auto& heads = grad_heads_[grad_of];
      heads.erase(std::remove(heads.begin(), heads.end(), last_grad_id_), heads.end());
    } else {
      consume(e.value, id);
      if (grad_of == e.value) grad_heads_[grad_of].clear();
    }
    grad_heads_[grad_of].push_back(id);
    remember(e, grad_of);
  }

  void remember(const Event& e, const std::string& grad_of) {
    last_grad_id_ = event_id(e);
    last_grad_of_ = grad_of;
    last_seq_ = e.seq;
  }

  void input_grad(const Event& e) {
    std::string tracked = e.out_spec, cot;
    auto g = f_.grads.find(e.value);
    if (g != f_.grads.end()) {
      if (!g->second.first.empty()) tracked = g->second.first;
      cot = g->second.second;
    }
    if (cot.empty() && e.note.compare(0, 10, "cotangent ") == 0) cot = e.note.substr(10);
    std::string label = bold("grad " + e.value) + kBr + small("tracked ", kGray, 9) + mono(tracked);
    const bool dual = cot.empty() || cot == tracked;
    if (!cot.empty()) {
      label += kBr + small("cotangent ", kGray, 9) + mono(cot, dual ? "#08306b" : kRed) + " " +
               font(dual ? "\u2713" : "\u2717", dual ? kGreen : kRed, 10);
    }
    if (!e.local_shapes.empty()) label += kBr + small("local " + local_shapes_str(e), kLightGray);
    auto errors = f_.grad_errors.find(e.value);
    const bool failing = errors != f_.grad_errors.end() || !dual;
    if (errors != f_.grad_errors.end()) label += error_lines(errors->second);
    node(backward_, event_id(e), node_attrs(Role::InputGrad, label, failing));
    consume(e.value, event_id(e));
  }

  // Edges from the nodes holding a gradient; a gradient no event produced (it flowed through a
  // local_map body, whose backward records only its collectives) comes from the seed, dotted.
  void consume(const std::string& value, const std::string& to) {
    const auto& heads = grad_heads_[value];
    for (const auto& from : heads) backward_edge(from, to);
    if (heads.empty() && !seed_id_.empty()) edge(seed_id_, to, {{"style", "dotted"}, {"color", kBackwardEdge}});
  }

  static Attrs tooltip(const Event& e) {
    if (!e.implicit.empty()) return {{"tooltip", e.implicit}, {"style", "filled,dashed"}};
    if (e.note.empty()) return {};
    return {{"tooltip", e.note}};
  }

  // A node of a folded event is its fold's node (drawn where its first event would be).
  void node(std::string& cluster_body, const std::string& id, const Attrs& attrs) {
    const std::string indent = in_body_ && &cluster_body != &forward_ ? "      " : "    ";
    if (fold_ < 0) {
      cluster_body += node_line(id, attrs, indent);
      return;
    }
    alias_[id] = fold_id(fold_);
    if (folds_drawn_.insert(fold_).second)
      cluster_body += node_line(fold_id(fold_), fold_attrs(c_.folds[fold_]), indent);
  }
  static bool is_fold(const std::string& id) { return id.compare(0, 4, "fold") == 0; }
  std::string resolve(const std::string& id) const {
    auto it = alias_.find(id);
    return it == alias_.end() ? id : it->second;
  }
  // The edges of folded events end at their fold's node: once each, none inside a fold.
  void edge(const std::string& from_id, const std::string& to_id, const Attrs& extra = {}) {
    const std::string from = resolve(from_id), to = resolve(to_id);
    if (from.empty() || to.empty()) return;
    const bool folded = is_fold(from) || is_fold(to);
    if (folded && (from == to || !fold_edges_.insert({from, to}).second)) return;
    Attrs attrs;
    auto it = out_edge_.find(from);
    if (it != out_edge_.end()) attrs = it->second;
    // A collective's bytes label its first outgoing edge only.
    if (!attrs.empty() && !labelled_.insert(from).second)
      attrs.erase(std::remove_if(attrs.begin(), attrs.end(), [](const auto& a) { return a.first == "xlabel"; }),
                  attrs.end());
    attrs.insert(attrs.end(), extra.begin(), extra.end());
    edges_ += "  " + quote(from) + " -> " + quote(to) + (attrs.empty() ? "" : attr_list(attrs)) + ";\n";
  }
  void backward_edge(const std::string& from_id, const std::string& to) {
    const std::string from = resolve(from_id);
    auto it = out_edge_.find(from);
    if (it != out_edge_.end() && !it->second.empty()) return edge(from, to, {{"style", "dashed"}});
    edge(from, to, {{"style", "dashed"}, {"color", kBackwardEdge}});
  }

  const Facts& f_;
  const Collapse& c_;
  int fold_ = -1;                                  // the fold of the event being drawn, or -1
  std::map<std::string, std::string> alias_;       // a folded event's node -> its fold's node
  std::set<int> folds_drawn_;
  std::set<std::pair<std::string, std::string>> fold_edges_;
  std::string forward_, backward_, edges_;
  std::vector<std::string> bodies_;  // the nodes of each local_map body
  bool in_body_ = false;
  std::map<std::string, std::string> current_;  // value name -> its latest node
  std::map<std::string, Attrs> out_edge_;       // step node -> the style of its outgoing edges
  std::set<std::string> labelled_;              // step nodes whose bytes label an edge already
  std::map<std::string, std::vector<const Event*>> pending_;
  std::map<std::string, std::string> spec_of_;
  std::map<std::string, std::vector<std::string>> grad_heads_;
  std::string seed_id_, last_grad_id_, last_grad_of_;
  int64_t last_seq_ = -2;
};

}  // namespace

std::string logical_view(const Trace& trace, const Facts& facts, const Collapse& collapse) {
  return Logical(trace, facts, collapse).body();
}

}  // namespace meshsim::render_detail
