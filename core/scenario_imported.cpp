// The fields of imported programs (docs/import.md, docs/scenario-format.md "Imported programs"):
// `source` on inputs and ops, `recorded` on program ops, `imported` at the top. Each is checked
// like the rest of the file: an error names the file and the JSON path (exit 2).
#include "core/scenario_imported.h"

#include "core/scenario_reader.h"

namespace meshsim {

using namespace scenario_detail;

std::string SourceRef::where() const {
  if (empty()) return "";
  std::string out = file.empty() ? "" : file + (line > 0 ? ":" + std::to_string(line) : "");
  if (!module.empty()) out += out.empty() ? module : " (" + module + ")";
  return out;
}

std::string ImportedFrom::label_of(const std::string& system) {
  return system == "pytorch" ? "PyTorch" : system == "jax" ? "JAX" : system;
}

nlohmann::json SourceRef::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  if (!module.empty()) j["module"] = module;
  if (!file.empty()) j["file"] = file;
  if (line > 0) j["line"] = line;
  if (!code.empty()) j["code"] = code;
  return j;
}

SourceRef parse_source(const nlohmann::json& v, const std::string& path, const std::string& file) {
  Reader r(file);
  r.only_keys(r.object(v, path), path, {"module", "file", "line", "code"});
  SourceRef s;
  if (v.contains("module")) s.module = r.string(v["module"], child(path, "module"));
  if (v.contains("file")) s.file = r.name(v["file"], child(path, "file"));
  if (v.contains("line")) {
    if (s.file.empty()) r.fail(child(path, "line"), "a line needs the file it is in (\"file\")");
    s.line = r.integer(v["line"], child(path, "line"), 1);
  }
  if (v.contains("code")) s.code = r.string(v["code"], child(path, "code"));
  if (s.empty()) r.fail(path, "a source names at least a \"module\" or a \"file\"");
  return s;
}

namespace {

// One placement per mesh axis, each a placement or null (not recorded on that axis).
std::vector<std::optional<Placement>> recorded_spec(const Reader& r, const nlohmann::json& v, const std::string& path,
                                                    const Mesh& mesh) {
  if (r.array(v, path).size() != static_cast<size_t>(mesh.ndim()))
    r.fail(path, "expected " + std::to_string(mesh.ndim()) + " placements (one per mesh axis " + join(mesh.axes()) +
                     ", null where none was recorded), got " + std::to_string(v.size()));
  std::vector<std::optional<Placement>> out;
  for (size_t k = 0; k < v.size(); ++k) {
    if (v[k].is_null()) {
      out.emplace_back();
      continue;
    }
    try {
      out.emplace_back(parse_placement(r.string(v[k], child(path, k))));
    } catch (const std::invalid_argument& e) {
      r.fail(child(path, k), e.what());
    }
  }
  return out;
}

}  // namespace

RecordedChoice parse_recorded(const nlohmann::json& v, const std::string& path, const std::string& file,
                              const Mesh& mesh, size_t n_args, size_t n_outs, const std::string& op) {
  Reader r(file);
  r.only_keys(r.object(v, path), path, {"placements", "collectives"});
  // A redistribute's and a local_map's moves are the program's own (their placements say them):
  // only the system's implicit moves before an op are recorded.
  if ((op == "redistribute" || op == "local_map") && v.contains("collectives"))
    r.fail(child(path, "collectives"), op + " moves its operands as the program says: record its placements only");
  RecordedChoice c;
  c.present = true;
  if (v.contains("placements")) {
    const std::string pp = child(path, "placements");
    const nlohmann::json& p = r.array(v["placements"], pp);
    const bool per_out = !p.empty() && p[0].is_array();
    if (!per_out) {
      if (n_outs != 1)
        r.fail(pp, "the op has " + std::to_string(n_outs) + " results: expected one list of placements per result");
      c.placements.push_back(recorded_spec(r, p, pp, mesh));
    } else {
      if (p.size() != n_outs)
        r.fail(pp, "expected one list of placements per result (" + std::to_string(n_outs) + "), got " +
                       std::to_string(p.size()));
      for (size_t k = 0; k < p.size(); ++k) c.placements.push_back(recorded_spec(r, p[k], child(pp, k), mesh));
    }
  }
  if (v.contains("collectives")) {
    const std::string cp = child(path, "collectives");
    const nlohmann::json& moves = r.array(v["collectives"], cp);
    for (size_t k = 0; k < moves.size(); ++k) {
      const std::string mp = child(cp, k);
      r.only_keys(r.object(moves[k], mp), mp, {"arg", "from", "to", "ops"});
      RecordedMove m;
      m.path = mp;
      const int64_t arg = r.integer(r.field(moves[k], mp, "arg"), child(mp, "arg"), 0);
      if (static_cast<size_t>(arg) >= n_args)
        r.fail(child(mp, "arg"), "the op has " + std::to_string(n_args) + " operand" + (n_args == 1 ? "" : "s") +
                                     ", there is no operand " + std::to_string(arg));
      m.arg = static_cast<size_t>(arg);
      for (const auto& earlier : c.moves)
        if (earlier.arg == m.arg)
          r.fail(child(mp, "arg"), "operand " + std::to_string(arg) + " is moved once per op; " + earlier.path +
                                       " names it already");
      m.from = r.spec(r.field(moves[k], mp, "from"), child(mp, "from"), mesh);
      m.to = r.spec(r.field(moves[k], mp, "to"), child(mp, "to"), mesh);
      if (moves[k].contains("ops")) r.array(moves[k]["ops"], child(mp, "ops"));  // informational
      c.moves.push_back(std::move(m));
    }
  }
  return c;
}

namespace {

void index_ops(const std::vector<OpDecl>& ops, SourceIndex& index) {
  for (const auto& op : ops) {
    if (!op.source.empty()) {
      index.by_path[op.path] = &op.source;
      for (const auto& o : op.outs) index.by_value.emplace(o, &op.source);
    }
    index_ops(op.body, index);
  }
}

}  // namespace

SourceIndex index_sources(const Scenario& sc) {
  SourceIndex index;
  for (const auto& in : sc.inputs)
    if (!in.source.empty()) {
      index.by_path[in.path] = &in.source;
      index.by_value[in.name] = &in.source;
    }
  index_ops(sc.program, index);
  return index;
}

ImportedFrom parse_imported(const nlohmann::json& v, const std::string& path, const std::string& file) {
  Reader r(file);
  r.only_keys(r.object(v, path), path, {"system", "version", "file", "function", "mesh", "backward_collectives"});
  ImportedFrom f;
  f.present = true;
  f.system = r.name(r.field(v, path, "system"), child(path, "system"));
  for (auto [key, into] : {std::pair{"version", &f.version}, {"file", &f.file}, {"function", &f.function},
                           {"mesh", &f.mesh}})
    if (v.contains(key)) *into = r.string(v[key], child(path, key));
  if (v.contains("backward_collectives")) {
    f.backward_recorded = true;
    const std::string bp = child(path, "backward_collectives");
    const nlohmann::json& list = r.array(v["backward_collectives"], bp);
    for (size_t k = 0; k < list.size(); ++k) {
      const std::string ep = child(bp, k);
      r.only_keys(r.object(list[k], ep), ep, {"op", "axis", "count"});
      ImportedFrom::Count c;
      c.op = r.name(r.field(list[k], ep, "op"), child(ep, "op"));
      c.axis = r.name(r.field(list[k], ep, "axis"), child(ep, "axis"));
      c.count = r.integer(r.field(list[k], ep, "count"), child(ep, "count"), 0);
      f.backward_collectives.push_back(std::move(c));
    }
  }
  return f;
}

}  // namespace meshsim
