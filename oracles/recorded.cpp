#include "oracles/recorded.h"

#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "core/cost_model.h"
#include "core/error.h"
#include "core/scenario_imported.h"

namespace meshsim {

namespace {

using json = nlohmann::json;

// R and Rd are the same layout; Rd only says its gradient is reduced, which PyTorch has no
// spelling for. Everything else must match exactly.
bool same_choice(const Placement& a, const Placement& b) {
  auto plain = [](const Placement& p) { return p.is_reduced() ? Placement::replicate() : p; };
  return plain(a) == plain(b);
}

bool same_spec(const Spec& a, const Spec& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!same_choice(a[k], b[k])) return false;
  return true;
}

Spec spec_of(const json& placements) {
  Spec out;
  for (const auto& p : placements) out.push_back(parse_placement(p.get<std::string>()));
  return out;
}

json recorded_spec_json(const std::vector<std::optional<Placement>>& spec) {
  json out = json::array();
  for (const auto& p : spec) out.push_back(p ? json(p->str()) : json(nullptr));
  return out;
}

std::string spec_text(const json& placements) {
  std::string out = "[";
  for (size_t k = 0; k < placements.size(); ++k)
    out += (k ? ", " : "") + (placements[k].is_null() ? std::string("-") : placements[k].get<std::string>());
  return out + "]";
}

std::string steps_text(const MoveCost& cost, const Mesh& mesh) {
  std::string out;
  for (const auto& s : cost.steps)
    out += (out.empty() ? "" : ", ") + std::string(step_kind_name(s.kind)) + " over " +
           mesh.axes()[static_cast<size_t>(s.axis)] + " " + grouped_digits(s.bytes) + " B";
  return out.empty() ? "no communication" : out;
}

// "mm \"h\" at /program/5, llama.py:57 (layers.0.attn.wq)"
std::string op_text(const OpDecl& op) {
  std::string out = op.op + " \"" + op.out + "\" at " + op.path;
  if (!op.source.empty()) out += ", " + op.source.where();
  return out;
}

// The bytes of one element of `value`: an int64 or bool input's own, else the run's float.
int64_t element_bytes_of(const Scenario& sc, const std::string& value, int64_t float_bytes) {
  const InputDecl* in = sc.find_input(value);
  if (in && in->dtype == ElementType::Int64) return 8;
  if (in && in->dtype == ElementType::Bool) return 1;
  return float_bytes;
}

struct MeshsimMove {
  Spec from, to;
  int64_t bytes = 0;  // the forward collectives of the move
  std::string collectives;
};

}  // namespace

json placements_json(const Spec& spec) {
  json out = json::array();
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

json recorded_json(const Scenario& sc, const RunOptions& options, const json& result) {
  bool any = sc.imported.present;
  for (const auto& op : sc.program) any |= op.recorded.present;
  if (!any) return nullptr;
  const std::string label = sc.imported.label();
  const int64_t element_bytes = options.dtype == DType::Float32 ? 4 : 8;
  const json& values = result.contains("values") ? result["values"] : json::object();

  // meshsim's own moves, per program op and operand value: the planner's forward redistributions.
  // Keyed by the operand's name: an op meshsim runs as its parts (linear, cross_entropy) has
  // operand indices of its parts, and moves of values the op makes itself are not the program's.
  std::map<std::pair<std::string, std::string>, MeshsimMove> moves;
  if (result.contains("implicit"))
    for (const auto& m : result["implicit"]) {
      if (m.value("phase", "") != "forward" || !m["program_op"].is_string()) continue;
      MeshsimMove mv{spec_of(m["from"]), spec_of(m["to"]), 0, ""};
      for (const auto& c : m["collectives"])
        if (c["phase"] == "forward") {
          mv.bytes += c["bytes"].get<int64_t>();
          mv.collectives += (mv.collectives.empty() ? "" : ", ") + c["op"].get<std::string>() + " over " +
                            c["axis"].get<std::string>() + " " + grouped_digits(c["bytes"].get<int64_t>()) + " B";
        }
      if (m.contains("operand") && m["operand"].is_string())
        moves[{m["program_op"].get<std::string>(), m["operand"].get<std::string>()}] = mv;
    }

  json differences = json::array();
  int64_t ops = 0, placements = 0, compared_moves = 0, recorded_bytes = 0, meshsim_bytes = 0;
  for (const auto& op : sc.program) {
    if (!op.recorded.present) continue;
    ++ops;
    for (size_t k = 0; k < op.recorded.placements.size() && k < op.outs.size(); ++k) {
      const std::string& out = op.outs[k];
      if (!values.contains(out) || !values[out].contains("placements")) continue;
      const Spec got = spec_of(values[out]["placements"]);
      const auto& want = op.recorded.placements[k];
      bool differs = false;
      for (size_t a = 0; a < want.size() && a < got.size(); ++a)
        if (want[a]) {
          ++placements;
          differs |= !same_choice(*want[a], got[a]);
        }
      if (!differs) continue;
      json d = {{"kind", "placement"},        {"program_op", op.path}, {"op", op.op}, {"value", out},
                {"recorded", recorded_spec_json(want)}, {"meshsim", values[out]["placements"]}};
      if (!op.source.empty()) d["source"] = op.source.to_json();
      d["message"] = "value \"" + out + "\" of " + op_text(op) + ": " + label + " chose " +
                     spec_text(d["recorded"]) + ", meshsim " + spec_text(d["meshsim"]);
      differences.push_back(std::move(d));
    }
    // Every operand either side moved.
    std::map<int64_t, const RecordedMove*> theirs;
    for (const auto& m : op.recorded.moves) theirs[static_cast<int64_t>(m.arg)] = &m;
    std::map<int64_t, const MeshsimMove*> ours;
    for (size_t a = 0; a < op.args.size(); ++a)
      if (auto it = moves.find({op.path, op.args[a]}); it != moves.end()) ours[static_cast<int64_t>(a)] = &it->second;
    std::set<int64_t> operands;
    for (const auto& [a, _] : theirs) operands.insert(a);
    for (const auto& [a, _] : ours) operands.insert(a);
    for (const int64_t a : operands) {
      ++compared_moves;
      const RecordedMove* t = theirs.count(a) ? theirs[a] : nullptr;
      const MeshsimMove* o = ours.count(a) ? ours[a] : nullptr;
      json rec = nullptr, mine = nullptr;
      std::string rec_text = "did not move it", mine_text = "did not move it (0 B)";
      if (t) {
        rec = {{"from", placements_json(t->from)}, {"to", placements_json(t->to)}, {"bytes", nullptr}};
        const std::string& operand = op.args[static_cast<size_t>(a)];
        rec_text = "moved it " + spec_str(t->from) + " -> " + spec_str(t->to);
        if (values.contains(operand) && values[operand].contains("shape")) {
          try {
            const MoveCost cost = estimate_move(sc.mesh, t->from, t->to, values[operand]["shape"].get<Shape>(),
                                                element_bytes_of(sc, operand, element_bytes));
            rec["bytes"] = cost.bytes;
            recorded_bytes += cost.bytes;
            rec_text += " (" + steps_text(cost, sc.mesh) + ")";
          } catch (const std::exception& e) {
            rec["bytes"] = nullptr;
            rec_text += std::string(" (a move meshsim's planner refuses: ") + e.what() + ")";
          }
        }
      }
      if (o) {
        mine = {{"from", placements_json(o->from)}, {"to", placements_json(o->to)}, {"bytes", o->bytes}};
        meshsim_bytes += o->bytes;
        mine_text = "moved it " + spec_str(o->from) + " -> " + spec_str(o->to) + " (" +
                    (o->collectives.empty() ? "no communication" : o->collectives) + ")";
      }
      if (t && o && same_spec(t->from, o->from) && same_spec(t->to, o->to)) continue;
      json d = {{"kind", "move"},
                {"program_op", op.path},
                {"op", op.op},
                {"value", op.out},
                {"arg", a},
                {"operand", op.args[static_cast<size_t>(a)]},
                {"recorded", rec},
                {"meshsim", mine}};
      if (!op.source.empty()) d["source"] = op.source.to_json();
      d["message"] = "operand " + std::to_string(a) + " \"" + op.args[static_cast<size_t>(a)] + "\" of " +
                     op_text(op) + ": " + label + " " + rec_text + "; meshsim " + mine_text;
      differences.push_back(std::move(d));
    }
  }

  int64_t backward_compared = 0;
  if (sc.imported.backward_recorded) {
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> theirs;  // (op, axis) -> count
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> ours;    // -> count, bytes
    for (const auto& c : sc.imported.backward_collectives) theirs[{c.op, c.axis}].first += c.count;
    if (result.contains("communication"))
      for (const auto& row : result["communication"]["by_axis"])
        if (row["phase"] == "backward") {
          auto& o = ours[{row["collective"].get<std::string>(), row["axis"].get<std::string>()}];
          o.first += row["count"].get<int64_t>();
          o.second += row["bytes"].get<int64_t>();
        }
    std::map<std::pair<std::string, std::string>, bool> keys;
    for (const auto& [k, _] : theirs) keys[k] = true;
    for (const auto& [k, _] : ours) keys[k] = true;
    for (const auto& [k, _] : keys) {
      ++backward_compared;
      const int64_t t = theirs.count(k) ? theirs[k].first : 0;
      const auto o = ours.count(k) ? ours[k] : std::pair<int64_t, int64_t>{0, 0};
      if (t == o.first) continue;
      differences.push_back({{"kind", "backward_collectives"},
                             {"collective", k.first},
                             {"axis", k.second},
                             {"recorded", t},
                             {"meshsim", o.first},
                             {"meshsim_bytes", o.second},
                             {"message", "backward " + k.first + " over " + k.second + ": " + label +
                                             " ran " + std::to_string(t) + ", meshsim " + std::to_string(o.first) +
                                             " (" + grouped_digits(o.second) + " B)"}});
    }
  }

  json out = {{"system", sc.imported.present ? json(sc.imported.system) : json(nullptr)},
              {"compared",
               {{"ops", ops}, {"placements", placements}, {"moves", compared_moves},
                {"backward_collectives", backward_compared}}},
              {"bytes", {{"recorded", recorded_bytes}, {"meshsim", meshsim_bytes}}},
              {"differences", differences}};
  if (sc.imported.present)
    for (auto [key, v] : {std::pair{"version", &sc.imported.version}, {"file", &sc.imported.file},
                          {"function", &sc.imported.function}, {"mesh", &sc.imported.mesh}})
      if (!v->empty()) out[key] = *v;
  return out;
}

namespace {

void annotate(json& entry, const SourceRef* src) {
  if (!src || !entry.is_object() || entry.contains("source")) return;
  entry["source"] = src->to_json();
  if (entry.contains("message") && entry["message"].is_string())
    entry["message"] = entry["message"].get<std::string>() + " [" + src->where() + "]";
}

}  // namespace

void attach_sources(const Scenario& sc, json& result) {
  const SourceIndex sources = index_sources(sc);
  const auto& by_path = sources.by_path;
  const auto& by_value = sources.by_value;
  if (by_path.empty()) return;
  auto lookup = [](const std::map<std::string, const SourceRef*>& m, const json& key) -> const SourceRef* {
    if (!key.is_string()) return nullptr;
    auto it = m.find(key.get<std::string>());
    return it == m.end() ? nullptr : it->second;
  };
  if (result.contains("first_divergence")) {
    json& d = result["first_divergence"];
    // A body op inside a local_map: its own source first.
    const SourceRef* src = d.contains("body") && d["body"].is_object() ? lookup(by_path, d["body"].value("op", json())) : nullptr;
    if (!src && d.is_object()) src = lookup(by_path, d.value("op", json()));
    annotate(d, src);
  }
  if (result.contains("mismatches"))
    for (auto& m : result["mismatches"]) annotate(m, m.is_object() ? lookup(by_value, m.value("value", json())) : nullptr);
}

}  // namespace meshsim
