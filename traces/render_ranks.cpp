// The rank view (see render.h): where the data lives. Which ranks are drawn and how they fold into
// classes of ranks alike, then the drawing, one cluster per class.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "traces/render.h"
#include "traces/render_common.h"

namespace meshsim::render_detail {

namespace {

// ---------------------------------------------------------------------------------------------
// Which ranks are drawn, and which of them are alike
// ---------------------------------------------------------------------------------------------

// The gray line under a value's name wraps at this many characters: the clusters stay narrow.
constexpr size_t kDetailWidth = 30;

// A collapsed mesh also draws the ranks a failure names, up to this many.
constexpr size_t kMaxFailingRanksShown = 4;

// The ranks drawn, ascending: all of them up to kRankViewMaxRanks, else the first 4 coordinates
// of a 1-axis mesh or the first 2 coordinates of each of the first 4 axes (1 of any further
// axis), plus the first few ranks a failure names.
std::vector<int64_t> shown_ranks(const Mesh& mesh, const Facts& f) {
  std::vector<int64_t> out;
  if (mesh.size() <= kRankViewMaxRanks) {
    for (int64_t r = 0; r < mesh.size(); ++r) out.push_back(r);
    return out;
  }
  std::vector<int64_t> keep(mesh.ndim());
  for (int a = 0; a < mesh.ndim(); ++a)
    keep[a] = std::min<int64_t>(mesh.axis_size(a), mesh.ndim() == 1 ? 4 : (a < 4 ? 2 : 1));
  std::vector<int64_t> c(mesh.ndim(), 0);
  while (true) {
    out.push_back(mesh.rank_of(c));
    int a = mesh.ndim() - 1;
    while (a >= 0 && ++c[a] == keep[a]) c[a--] = 0;
    if (a < 0) break;
  }
  std::set<int64_t> failing;
  for (const auto& [value, by_rank] : f.rank_errors)
    for (const auto& [rank, messages] : by_rank)
      if (rank < mesh.size() && std::find(out.begin(), out.end(), rank) == out.end()) failing.insert(rank);
  for (int64_t rank : failing) {
    if (out.size() >= kRankViewMaxRanks + kMaxFailingRanksShown) break;
    out.push_back(rank);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The shown ranks (indices into `shown`) grouped as a collective over `axis` groups them, in
// order of their first rank; all together for an axis the mesh does not have.
std::vector<std::vector<size_t>> collective_groups(const Mesh& mesh, const std::vector<int64_t>& shown,
                                                   const std::string& axis) {
  const int a = mesh.axis_index(axis);
  std::vector<std::vector<size_t>> out;
  std::map<std::vector<int64_t>, size_t> index;
  for (size_t i = 0; i < shown.size(); ++i) {
    std::vector<int64_t> key = mesh.coords(shown[i]);
    if (a >= 0) key[a] = -1;
    else key.assign(1, 0);
    auto [it, fresh] = index.emplace(key, out.size());
    if (fresh) out.emplace_back();
    out[it->second].push_back(i);
  }
  return out;
}

// Numbers keys by their first appearance: equal keys, equal numbers.
std::vector<size_t> number_keys(const std::vector<std::string>& keys, size_t* count) {
  std::map<std::string, size_t> index;
  std::vector<size_t> out;
  for (const auto& key : keys) out.push_back(index.emplace(key, index.size()).first->second);
  *count = index.size();
  return out;
}

// Which shown ranks are alike: two ranks are when every event gives them the same local shape,
// the same values fail on both (a failure naming the rank), and every collective puts them in
// groups of the same classes (partition refinement to a fixed point, so that each class meets
// one node per collective). Returns the class of each shown rank; classes are numbered by their
// first rank.
std::vector<size_t> rank_classes(const Trace& t, const Facts& f, const std::vector<int64_t>& shown, size_t* count) {
  std::vector<std::string> keys(shown.size());
  for (size_t i = 0; i < shown.size(); ++i) {
    const auto r = static_cast<size_t>(shown[i]);
    for (const auto& e : t.events) keys[i] += (r < e.local_shapes.size() ? shape_str(e.local_shapes[r]) : "?") + ";";
    for (const auto& [value, by_rank] : f.rank_errors)
      if (by_rank.count(shown[i])) keys[i] += "!" + value + ";";
  }
  std::vector<std::vector<std::vector<size_t>>> groups;  // per collective event
  for (const auto& e : t.events)
    if (e.kind == "collective") groups.push_back(collective_groups(f.mesh, shown, e.axis));
  std::vector<size_t> cls = number_keys(keys, count);
  while (true) {
    for (size_t i = 0; i < shown.size(); ++i) keys[i] = std::to_string(cls[i]);
    for (const auto& event_groups : groups) {
      for (const auto& group : event_groups) {
        std::vector<size_t> classes;
        for (size_t i : group) classes.push_back(cls[i]);
        std::sort(classes.begin(), classes.end());
        std::string text = "|";
        for (size_t c : classes) text += std::to_string(c) + ",";
        for (size_t i : group) keys[i] += text;
      }
    }
    size_t refined = 0;
    std::vector<size_t> next = number_keys(keys, &refined);
    if (refined == *count) return cls;  // a refinement only splits: same count, same classes
    cls = std::move(next);
    *count = refined;
  }
}

// "0, 4", "0–3, 8–11": runs of three or more as ranges.
std::string ranks_text(const std::vector<int64_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += out.empty() ? "" : ", ";
    if (j >= i + 2) {
      out += std::to_string(ranks[i]) + "\u2013" + std::to_string(ranks[j]);
    } else {
      out += std::to_string(ranks[i]);
      if (j == i + 1) out += ", " + std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The drawing: one cluster per class of ranks alike, one node per collective and class of groups
// ---------------------------------------------------------------------------------------------

class RankView {
 public:
  RankView(const Trace& trace, const Facts& facts, const Collapse& collapse)
      : f_(facts), c_(collapse), mesh_(facts.mesh), shown_(shown_ranks(facts.mesh, facts)) {
    size_t count = 0;
    class_of_ = rank_classes(trace, facts, shown_, &count);
    members_.resize(count);
    for (size_t i = 0; i < shown_.size(); ++i) members_[class_of_[i]].push_back(i);
    for (const auto& m : members_) rep_.push_back(shown_[m.front()]);
    body_.resize(count);
    first_node_.resize(count);
    holder_.resize(count);
    heads_.resize(count);
    coords_.resize(count, std::vector<std::set<int64_t>>(mesh_.ndim()));
    for (size_t s = 0; s < count; ++s)
      for (size_t i : members_[s])
        for (int a = 0; a < mesh_.ndim(); ++a) coords_[s][a].insert(mesh_.coord(shown_[i], a));
    nest_levels_ = 0;
    while (nest_levels_ + 1 < mesh_.ndim() && std::all_of(coords_.begin(), coords_.end(), [&](const auto& c) {
             return c[nest_levels_].size() == 1;
           }))
      ++nest_levels_;
    for (size_t i = 0; i < trace.events.size(); ++i) {
      fold_ = c_.at(i);
      add(trace.events[i]);
    }
    fold_ = -1;
  }

  bool collapsed() const { return static_cast<int64_t>(shown_.size()) < mesh_.size(); }
  bool folded() const { return members_.size() < shown_.size(); }

  std::string view_line() const {
    std::string line = "rank view: ";
    if (!collapsed()) line += std::to_string(mesh_.size()) + (mesh_.size() == 1 ? " rank" : " ranks");
    else
      line += std::to_string(shown_.size()) + " of " + std::to_string(mesh_.size()) +
              " ranks shown (meshes over " + std::to_string(kRankViewMaxRanks) + " ranks are collapsed)";
    if (folded()) {
      line += ", drawn as " + std::to_string(members_.size()) +
              (members_.size() == 1 ? " class" : " classes") + " of ranks alike (same local shapes, same collectives)";
    }
    return line;
  }

  std::string body() const {
    std::vector<size_t> all(members_.size());
    for (size_t s = 0; s < all.size(); ++s) all[s] = s;
    std::string out = clusters(0, all, "  ");
    if (collapsed()) {
      const int64_t more = mesh_.size() - static_cast<int64_t>(shown_.size());
      std::string label = bold("\u2026 and " + std::to_string(more) + " more ranks like these") + kBr +
                          small("mesh " + mesh_.str() + " (" + std::to_string(mesh_.size()) + " ranks)", kGray, 9) +
                          kBr + small("collectives list the shown members of each group", kGray, 9);
      out += node_line("more ranks", {{"label", html_value(label)},
                                      {"shape", "box"},
                                      {"style", "rounded,dashed"},
                                      {"color", "#969696"},
                                      {"margin", "0.2,0.1"}},
                       "  ");
    }
    return out + groups_ + order() + edges_;
  }

  // The classes left to right by their first rank. dot may swap sibling clusters freely (flat
  // edges between clusters do not bind it), so hidden points above the clusters fix it: one root
  // with ordering=out points at one point per class, in order, and each of those at its class's
  // first node; any other order of the clusters would cross these edges.
  std::string order() const {
    std::string out;
    int count = 0;
    for (size_t s = 0; s < members_.size(); ++s) {
      if (first_node_[s].empty()) continue;
      const std::string id = quote("order:" + std::to_string(rep_[s]));
      out += "  " + id + " [shape=\"point\", style=\"invis\", width=\"0.05\", height=\"0.05\"];\n";
      out += "  \"order\" -> " + id + " [style=\"invis\"];\n";
      out += "  " + id + " -> " + quote(resolve(first_node_[s])) + " [style=\"invis\"];\n";
      ++count;
    }
    if (count < 2) return "";
    return "  \"order\" [shape=\"point\", style=\"invis\", width=\"0.05\", height=\"0.05\", ordering=\"out\"];\n" + out;
  }

 private:
  using Ids = std::vector<std::string>;

  void add(const Event& e) {
    const bool forward = e.phase == "forward";
    if (e.kind == "collective" || e.kind == "local") {
      if (forward) return void(pending_[e.value].push_back(&e));
      return backward_step(e);
    }
    if (forward) return e.kind == "input" ? input(e) : op(e);
    if (e.kind == "seed") return seed(e);
    if (e.kind == "input_grad") return input_grad(e);
    grad(e);
  }

  size_t classes() const { return members_.size(); }
  // The nodes of class s are named after its first rank: "r4:v:x".
  std::string rid(size_t s, const std::string& base) const { return "r" + std::to_string(rep_[s]) + ":" + base; }
  // Every rank of a class holds the same local shape.
  std::string local_shape(const Event& e, size_t s) const {
    const auto r = static_cast<size_t>(rep_[s]);
    return r < e.local_shapes.size() ? shape_str(e.local_shapes[r]) : "?";
  }
  std::vector<int64_t> ranks_of(const std::vector<size_t>& shown_indices) const {
    std::vector<int64_t> out;
    for (size_t i : shown_indices) out.push_back(shown_[i]);
    std::sort(out.begin(), out.end());
    return out;
  }

  // A node of class s: "name [local shape]" over a small gray line.
  void rank_node(size_t s, const std::string& id, Role role, const std::string& name, const Event& e,
                 const std::string& detail, const std::vector<std::string>* errors = nullptr) {
    if (first_node_[s].empty()) first_node_[s] = id;
    // A failure names a DTensor: its LTensor namesake inside a local_map body is not marked.
    if (errors && is_ltensor_spec(e.out_spec) && f_.dtensor_values.count(name)) errors = nullptr;
    std::string label = bold(name) + " " + mono(local_shape(e, s), "#08306b", 9);
    for (const auto& line : wrap(detail, kDetailWidth)) label += kBr + small(line);
    bool failing = false;
    if (errors) {
      failing = true;
      std::vector<std::string> mine;  // each names its rank, "rank 5 holds ..."
      auto re = f_.rank_errors.find(name);
      if (re != f_.rank_errors.end()) {
        // Rank-specific failures mark only their rank's class, unless some failure is not
        // rank-specific.
        size_t specific = 0;
        for (const auto& [rank, msgs] : re->second) specific += msgs.size();
        for (size_t i : members_[s]) {
          auto here = re->second.find(shown_[i]);
          if (here != re->second.end()) mine.insert(mine.end(), here->second.begin(), here->second.end());
        }
        failing = specific < errors->size() || !mine.empty();
      }
      if (!mine.empty()) label += error_lines(mine, 30);
    }
    // Where a DTensor's ranks sit in it: the block each rank of the class holds.
    if (!is_ltensor_spec(e.out_spec) && static_cast<size_t>(rep_[s]) < e.local_shapes.size()) {
      const std::string value = name.compare(0, 5, "grad ") == 0 ? name.substr(5) : name;
      auto global = f_.global_shape.find(value);
      if (global != f_.global_shape.end()) {
        const std::string picture = block_picture(mesh_, e.out_spec, global->second, ranks_of(members_[s]), shown_,
                                                  e.local_shapes[static_cast<size_t>(rep_[s])]);
        if (!picture.empty())
          label = "<TABLE BORDER=\"0\" CELLBORDER=\"0\" CELLSPACING=\"1\" CELLPADDING=\"0\"><TR><TD>" + label +
                  "</TD></TR>" + picture + "</TABLE>";
      }
    }
    emit(s, id, node_attrs(role, label, failing, {{"fontsize", "9"}}));
  }

  // A node of class s; for a folded event, the fold's node in that class (drawn once).
  void emit(size_t s, const std::string& id, const Attrs& attrs) {
    if (fold_ < 0) {
      body_[s] += node_line(id, attrs, "      ");
      return;
    }
    const std::string fold = rid(s, fold_id(fold_));
    alias_[id] = fold;
    if (folds_drawn_.insert(fold).second)
      body_[s] += node_line(fold, fold_attrs(c_.folds[fold_], {{"fontsize", "9"}}), "      ");
  }
  std::string resolve(const std::string& id) const {
    auto it = alias_.find(id);
    return it == alias_.end() ? id : it->second;
  }

  const std::vector<std::string>* errors_of(const std::map<std::string, std::vector<std::string>>& m,
                                            const std::string& name) const {
    auto it = m.find(name);
    return it == m.end() ? nullptr : &it->second;
  }

  std::string holder(size_t s, const std::string& name) {
    if (name.empty()) return "";
    auto it = holder_[s].find(name);
    if (it != holder_[s].end()) return it->second;
    const std::string id = rid(s, value_id(name));
    emit(s, id, node_attrs(Role::Ghost, esc(name), false, {{"fontsize", "9"}}));
    holder_[s][name] = id;
    return id;
  }

  // "r0:v:x", or "r0:v:x@5" when the name was drawn before in that class.
  std::string fresh_value_id(size_t s, const Event& e) const {
    return rid(s, value_id(e.value) + (holder_[s].count(e.value) ? "@" + std::to_string(e.seq) : ""));
  }

  void input(const Event& e) {
    for (size_t s = 0; s < classes(); ++s) {
      const std::string id = fresh_value_id(s, e);
      rank_node(s, id, Role::Input, e.value, e, "input " + e.out_spec, errors_of(f_.value_errors, e.value));
      holder_[s][e.value] = id;
    }
  }

  std::vector<const Event*> take(const std::string& value) { return take_pending(pending_, value); }

  void op(const Event& e) {
    std::string args;
    for (const auto& a : e.args) args += (args.empty() ? "" : ", ") + a;
    const std::string detail = e.name + "(" + args + ") \u2192 " + e.out_spec;
    Ids targets;
    for (size_t s = 0; s < classes(); ++s) targets.push_back(fresh_value_id(s, e));
    const auto own = take(e.value);
    std::vector<std::vector<Ids>> incoming;  // per operand: sources per class
    if (e.name == "redistribute") {
      incoming.push_back(chain(sources(e.args.empty() ? "" : e.args.front()), own, false));
    } else {
      bool own_used = own.empty();
      for (const auto& arg : e.args) {
        auto moved = take(arg);
        if (!moved.empty()) {
          std::string src = moved.front()->args.empty() ? implicit_source(f_, arg) : moved.front()->args.front();
          incoming.push_back(chain(sources(src), moved, false));
        } else if (!own_used) {
          incoming.push_back(chain(sources(arg), own, false));
          own_used = true;
        } else {
          incoming.push_back(sources(arg));
        }
      }
    }
    for (size_t s = 0; s < classes(); ++s) {
      rank_node(s, targets[s], is_implicit(e.value) ? Role::Implicit : Role::Value, e.value, e, detail,
                errors_of(f_.value_errors, e.value));
      holder_[s][e.value] = targets[s];
      for (const auto& srcs : incoming)
        for (const auto& from : srcs[s]) edge(from, targets[s], false);
    }
  }

  std::vector<Ids> sources(const std::string& name) {
    std::vector<Ids> out(classes());
    if (name.empty()) return out;
    for (size_t s = 0; s < classes(); ++s) out[s] = {holder(s, name)};
    return out;
  }

  // Runs the steps of a chain from the per-class sources; returns the per-class nodes at its end.
  std::vector<Ids> chain(std::vector<Ids> cur, const std::vector<const Event*>& steps, bool backward) {
    for (const Event* step : steps) cur = run_step(*step, cur, backward);
    return cur;
  }

  // "ranks 0, 4" for one group, "4 groups: {0, 4} {1, 5} {2, 6} {3, 7}" for several (the first
  // two and the last of more than four).
  std::string groups_text(const std::vector<std::vector<int64_t>>& groups) const {
    std::string out;
    if (groups.size() == 1) {
      out = "ranks " + ranks_text(groups.front());
    } else {
      out = std::to_string(groups.size()) + " groups:";
      for (size_t g = 0; g < groups.size(); ++g) {
        if (groups.size() > 4 && g == 2) out += " \u2026";
        if (groups.size() > 4 && g >= 2 && g + 1 < groups.size()) continue;
        out += " {" + ranks_text(groups[g]) + "}";
      }
    }
    return out;
  }

  std::vector<Ids> run_step(const Event& e, const std::vector<Ids>& cur, bool backward) {
    std::vector<Ids> next(classes());
    // A folded collective has no node of its own: each class's fold stands for it.
    if (e.kind != "collective" || fold_ >= 0) {
      for (size_t s = 0; s < classes(); ++s) {
        const std::string id = rid(s, event_id(e));
        std::string label = bold(drawn_name(f_, e)) + " " + mono(local_shape(e, s), "#222222", 9);
        emit(s, id, step_attrs(e.name, label, {{"fontsize", "8"}}));
        if (backward) consume(s, cur[s], id);
        else for (const auto& from : cur[s]) edge(from, id, backward);
        next[s] = {id};
      }
      return next;
    }
    const StepStyle& style = step_style(e.name);
    const int a = mesh_.axis_index(e.axis);
    const int64_t group_size = a >= 0 ? mesh_.axis_size(a) : mesh_.size();
    // Groups whose members fall in the same classes (as many of each) are drawn as one node:
    // by the folding, each class meets one node.
    std::vector<std::vector<size_t>> node_classes;             // per node: its classes, ascending
    std::vector<std::vector<std::vector<int64_t>>> node_groups;  // per node: its groups' ranks
    std::map<std::vector<size_t>, size_t> index;
    for (const auto& group : collective_groups(mesh_, shown_, e.axis)) {
      std::vector<size_t> key;
      for (size_t i : group) key.push_back(class_of_[i]);
      std::sort(key.begin(), key.end());
      auto [it, fresh] = index.emplace(key, node_classes.size());
      if (fresh) {
        key.erase(std::unique(key.begin(), key.end()), key.end());
        node_classes.push_back(key);
        node_groups.emplace_back();
      }
      node_groups[it->second].push_back(ranks_of(group));
    }
    // The nodes of one collective left to right by their first rank: a hidden point with
    // ordering=out points at them in that order.
    const std::string pin = quote(event_id(e) + ":order");
    if (node_classes.size() > 1)
      groups_ += "  " + pin + " [shape=\"point\", style=\"invis\", width=\"0.05\", height=\"0.05\", ordering=\"out\"];\n";
    for (size_t n = 0; n < node_classes.size(); ++n) {
      const std::string id = event_id(e) + ":g" + std::to_string(node_groups[n].front().front());
      std::string label = font(bold(e.name), style.line) + (e.axis.empty() ? "" : " " + font(esc(e.axis), kGray));
      for (const auto& line : wrap(groups_text(node_groups[n]), 26)) label += kBr + small(line, "#333333", 8);
      if (static_cast<int64_t>(node_groups[n].front().size()) < group_size) {  // a collapsed mesh
        label += kBr + small("\u2026 (" + std::to_string(group_size) +
                             (node_groups[n].size() == 1 ? " in the group)" : " in each group)"), "#333333", 8);
      }
      // The transition on two lines when long: a collective's outline widens with its label.
      const std::string moves = transition(e);
      const auto arrow = moves.find(" \u2192 ");
      if (moves.size() > 26 && arrow != std::string::npos) {
        label += kBr + mono(moves.substr(0, arrow + 4), "#222222", 8) + kBr + mono(moves.substr(arrow + 5), "#222222", 8);
      } else if (!moves.empty()) {
        label += kBr + mono(moves, "#222222", 8);
      }
      if (e.bytes > 0) label += kBr + font(esc(bytes_str(e.bytes) + "/rank"), style.line, 9);
      // A backward step's note ("backward of redistribute") is its tooltip only: the node stays small.
      Attrs extra = {{"fontsize", "9"}};
      if (!e.implicit.empty()) {  // the planner's move: dashed, its reason the tooltip
        extra.emplace_back("tooltip", e.implicit);
        extra.emplace_back("style", "filled,dashed");
      } else if (!e.note.empty()) {
        extra.emplace_back("tooltip", e.note);
      }
      groups_ += node_line(id, step_attrs(e.name, label, extra), "  ");
      if (node_classes.size() > 1) groups_ += "  " + pin + " -> " + quote(id) + " [style=\"invis\"];\n";
      group_style_[id] = {{"color", style.line}, {"penwidth", "1.6"}};
      for (size_t s : node_classes[n]) {
        if (backward) consume(s, cur[s], id);
        else for (const auto& from : cur[s]) edge(from, id, backward);
        next[s] = {id};
      }
    }
    return next;
  }

  void seed(const Event& e) {
    for (size_t s = 0; s < classes(); ++s) {
      const std::string id = rid(s, event_id(e));
      rank_node(s, id, Role::Seed, "grad " + e.value, e, "seed " + e.out_spec);
      auto h = holder_[s].find(e.value);
      if (h != holder_[s].end()) add_edge(h->second, id, {{"style", "dotted"}, {"color", "#969696"}});
      heads_[s][e.value] = {id};
    }
    seed_seq_ = e.seq;
  }

  void grad(const Event& e) {
    for (size_t s = 0; s < classes(); ++s) {
      const std::string id = rid(s, event_id(e));
      rank_node(s, id, Role::Grad, "grad " + e.value, e, "from " + e.name + " \u2192 " + e.out_spec);
      if (!e.args.empty()) consume(s, heads_[s][e.args.front()], id);
      heads_[s][e.value].push_back(id);
    }
    last_out_.assign(classes(), {});
    for (size_t s = 0; s < classes(); ++s) last_out_[s] = {rid(s, event_id(e))};
    last_grad_of_ = e.value;
    last_seq_ = e.seq;
  }

  void backward_step(const Event& e) {
    const std::string grad_of = e.args.empty() ? e.value : e.args.front();
    const bool chained = last_grad_of_ == grad_of && last_seq_ + 1 == e.seq && !last_out_.empty();
    std::vector<Ids> src(classes());
    for (size_t s = 0; s < classes(); ++s) src[s] = chained ? last_out_[s] : heads_[s][e.value];
    const std::vector<Ids> out = run_step(e, src, true);
    for (size_t s = 0; s < classes(); ++s) {
      Ids& heads = heads_[s][grad_of];
      if (chained) {
        for (const auto& id : last_out_[s]) heads.erase(std::remove(heads.begin(), heads.end(), id), heads.end());
      } else if (grad_of == e.value) {
        heads.clear();
      }
      heads.insert(heads.end(), out[s].begin(), out[s].end());
    }
    last_out_ = out;
    last_grad_of_ = grad_of;
    last_seq_ = e.seq;
  }

  void input_grad(const Event& e) {
    std::string tracked = e.out_spec;
    auto g = f_.grads.find(e.value);
    if (g != f_.grads.end() && !g->second.first.empty()) tracked = g->second.first;
    for (size_t s = 0; s < classes(); ++s) {
      const std::string id = rid(s, event_id(e));
      rank_node(s, id, Role::InputGrad, "grad " + e.value, e, "tracked " + tracked,
                errors_of(f_.grad_errors, e.value));
      consume(s, heads_[s][e.value], id);
    }
  }

  // Backward edges from the nodes holding a gradient in class s; a gradient no event produced
  // (through a local_map body) comes from the seed, dotted.
  void consume(size_t s, const Ids& heads, const std::string& to) {
    for (const auto& from : heads) edge(from, to, true);
    if (heads.empty() && seed_seq_ >= 0)
      add_edge(rid(s, "e" + std::to_string(seed_seq_)), to, {{"style", "dotted"}, {"color", kBackwardEdge}});
  }

  void edge(const std::string& from, const std::string& to, bool backward) {
    Attrs attrs;
    auto it = group_style_.find(from);
    if (it == group_style_.end()) it = group_style_.find(to);
    if (it != group_style_.end()) attrs = it->second;
    if (backward) {
      attrs.emplace_back("style", "dashed");
      if (it == group_style_.end()) attrs.emplace_back("color", kBackwardEdge);
    }
    add_edge(from, to, attrs);
  }
  // The edges of folded events end at their fold's node, none inside a fold.
  void add_edge(const std::string& from_id, const std::string& to_id, const Attrs& attrs) {
    const std::string from = resolve(from_id), to = resolve(to_id);
    if (from.empty() || to.empty() || (from == to && (from != from_id || to != to_id))) return;
    if (!edge_seen_.insert({from, to}).second) return;
    edges_ += "  " + quote(from) + " -> " + quote(to) + (attrs.empty() ? "" : attr_list(attrs)) + ";\n";
  }

  // "dp=*, tp=0,1" for the axes from `level` on: "*" for every coordinate of an axis; empty when
  // the class is not a sub-mesh (its ranks are not every combination of its coordinates).
  std::string coords_text(size_t s, int level) const {
    size_t combinations = 1;
    for (const auto& c : coords_[s]) combinations *= c.size();
    if (combinations != members_[s].size()) return "";
    std::string out;
    for (int a = level; a < mesh_.ndim(); ++a) {
      const auto& c = coords_[s][a];
      std::string values;
      if (c.size() > 1 && static_cast<int64_t>(c.size()) == mesh_.axis_size(a)) {
        values = "*";
      } else {
        for (int64_t v : c) values += (values.empty() ? "" : ",") + std::to_string(v);
      }
      out += (out.empty() ? "" : ", ") + mesh_.axes()[a] + "=" + values;
    }
    return out;
  }

  // A class's cluster: "rank 3 · tp=1" for a rank alone, "ranks 0–3 (4 alike) · dp=*" otherwise.
  std::string class_cluster(size_t s, const std::string& indent) const {
    const std::string coords = coords_text(s, nest_levels_);
    std::string label;
    if (members_[s].size() == 1) {
      label = "rank " + std::to_string(rep_[s]) + (coords.empty() ? "" : "  \u00b7  " + coords);
    } else {
      label = html_value(bold("ranks " + ranks_text(ranks_of(members_[s]))) + " " +
                         font(esc("(" + std::to_string(members_[s].size()) + " alike)"), kGray, 10) +
                         (coords.empty() ? "" : kBr + font(esc(coords), "#333333", 11)));
    }
    return cluster("rank" + std::to_string(rep_[s]),
                   {{"label", label}, {"style", "rounded,filled"}, {"fillcolor", "white"},
                    {"color", members_[s].size() == 1 ? "#7f8c99" : "#4d5d6c"},
                    {"penwidth", members_[s].size() == 1 ? "1" : "1.6"}, {"fontsize", "11"}},
                   body_[s].empty() ? "      \"" + rid(s, "empty") + "\" [style=\"invis\"];\n" : body_[s], indent);
  }

  // One cluster per coordinate of axis `level` holding those of the next axis, as deep as every
  // class has one coordinate on the axis; the classes innermost.
  std::string clusters(int level, const std::vector<size_t>& slots, const std::string& indent) const {
    static const char* kFills[] = {"#f4f6f8", "#e9edf1", "#f4f6f8", "#e9edf1"};
    std::string out;
    if (level == nest_levels_) {
      for (size_t s : slots) out += class_cluster(s, indent);
      return out;
    }
    const std::string& axis = mesh_.axes()[level];
    std::vector<std::pair<int64_t, std::vector<size_t>>> by_coord;
    for (size_t s : slots) {
      const int64_t c = *coords_[s][level].begin();
      if (by_coord.empty() || by_coord.back().first != c) by_coord.push_back({c, {}});
      by_coord.back().second.push_back(s);
    }
    for (const auto& [c, sub] : by_coord) {
      std::string name = "axes";
      for (int a = 0; a <= level; ++a) name += ":" + mesh_.axes()[a] + "=" + std::to_string(*coords_[sub.front()][a].begin());
      out += cluster(name,
                     {{"label", axis + " = " + std::to_string(c)}, {"style", "rounded,filled"},
                      {"fillcolor", kFills[level % 4]}, {"color", "#a9b4bf"}, {"fontsize", "12"}},
                     clusters(level + 1, sub, indent + "  "), indent);
    }
    return out;
  }

  const Facts& f_;
  const Collapse& c_;
  int fold_ = -1;                                 // the fold of the event being drawn, or -1
  std::map<std::string, std::string> alias_;      // a folded event's node -> its fold's node
  std::set<std::string> folds_drawn_;
  const Mesh& mesh_;
  std::vector<int64_t> shown_;               // the ranks drawn, ascending
  std::vector<size_t> class_of_;             // per shown rank: its class
  std::vector<std::vector<size_t>> members_;  // per class: its shown ranks (indices into shown_)
  std::vector<int64_t> rep_;                 // per class: its first rank, which names its nodes
  std::vector<std::vector<std::set<int64_t>>> coords_;  // per class, per axis: its coordinates
  int nest_levels_ = 0;                      // axes drawn as nested clusters around the classes
  std::vector<std::string> body_;            // per class: its nodes
  std::vector<std::string> first_node_;      // per class: its first node, to order the classes
  std::string groups_, edges_;
  std::set<std::pair<std::string, std::string>> edge_seen_;
  std::map<std::string, Attrs> group_style_;
  std::vector<std::map<std::string, std::string>> holder_;  // per class: value -> node
  std::map<std::string, std::vector<const Event*>> pending_;
  std::vector<std::map<std::string, Ids>> heads_;           // per class: gradient -> nodes
  std::vector<Ids> last_out_;
  std::string last_grad_of_;
  int64_t last_seq_ = -2;
  int64_t seed_seq_ = -1;
};

}  // namespace

RankViewText rank_view(const Trace& trace, const Facts& facts, const Collapse& collapse) {
  RankView view(trace, facts, collapse);
  return {view.body(), view.view_line()};
}

}  // namespace meshsim::render_detail
