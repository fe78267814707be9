// The explorer's model of a run (explore.h): what the page shows, as compact JSON.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "traces/explore.h"
#include "traces/explore_graph.h"
#include "traces/render_common.h"

namespace meshsim {

using nlohmann::json;
using render_detail::Collapse;
using render_detail::Facts;

namespace {

// Each rank's local shape as runs of consecutive ranks alike: [[count, shape], ...] (1024 ranks of
// one shape are one pair).
json shape_runs(const std::vector<std::vector<int64_t>>& shapes) {
  json runs = json::array();
  for (size_t r = 0; r < shapes.size();) {
    size_t end = r + 1;
    while (end < shapes.size() && shapes[end] == shapes[r]) ++end;
    runs.push_back(json::array({static_cast<int64_t>(end - r), shapes[r]}));
    r = end;
  }
  return runs;
}

json event_json(const Event& e, int layer) {
  json out = {{"s", e.seq},       {"p", e.phase == "backward" ? "b" : "f"}, {"k", e.kind},
              {"n", e.name},      {"v", e.value},                           {"o", e.out_spec},
              {"g", layer}};
  if (!e.args.empty()) out["a"] = e.args;
  if (!e.in_specs.empty()) out["i"] = e.in_specs;
  if (!e.axis.empty()) out["x"] = e.axis;
  if (e.bytes) out["b"] = e.bytes;
  if (!e.implicit.empty()) out["m"] = e.implicit;
  if (!e.note.empty()) out["t"] = e.note;
  return out;
}

json failure_of(const json& result) {
  json out = json::object();
  if (!result.is_object()) return out;
  for (const char* key : {"failures", "first_divergence", "max_abs_error", "error", "checks"})
    if (result.contains(key) && !result[key].is_null()) out[key] = result[key];
  return out;
}

// The layer of each event: its fold's, folded by layer (render.h, "Layers"); -1 outside every layer.
std::vector<int> layer_of_events(const Collapse& c, const std::vector<std::string>& names) {
  std::vector<int> out(c.fold_of.empty() ? 0 : c.fold_of.size(), -1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int f = c.at(i);
    if (f < 0) continue;
    for (size_t k = 0; k < names.size(); ++k)
      if (names[k] == c.folds[static_cast<size_t>(f)].layer) out[i] = static_cast<int>(k);
  }
  return out;
}

}  // namespace

namespace {

struct LayerPlan {
  std::vector<std::string> layers;
  std::vector<int> layer_of;  // per event
};

LayerPlan plan_layers(const Trace& t, const Facts& f) {
  const Collapse c = render_detail::plan_layer_folds(t, f);
  LayerPlan out;
  // Layer names in order of first appearance: a layer's forward and backward boxes are one layer.
  for (const auto& fold : c.folds)
    if (std::find(out.layers.begin(), out.layers.end(), fold.layer) == out.layers.end())
      out.layers.push_back(fold.layer);
  out.layer_of = layer_of_events(c, out.layers);
  out.layer_of.resize(t.events.size(), -1);
  return out;
}

}  // namespace

std::vector<std::string> explore_dot_texts(const Trace& t) {
  const Facts f = render_detail::facts_of(t);
  const LayerPlan plan = plan_layers(t, f);
  return explore_dots(t, f, plan.layer_of, plan.layers);
}

json explore_model(const ExploreRun& run) {
  const Trace& t = run.trace;
  const Facts f = render_detail::facts_of(t);
  const LayerPlan plan = plan_layers(t, f);
  const std::vector<std::string>& layers = plan.layers;
  const std::vector<int>& layer_of = plan.layer_of;

  json model = {{"name", f.name},
                {"file", run.file},
                {"status", f.status.empty() ? "unknown" : f.status},
                {"version", t.version},
                {"mesh", {{"axes", f.mesh.axes()}, {"shape", f.mesh.shape()}}},
                {"layers", layers},
                {"failure", failure_of(t.result)}};
  if (t.result.is_object() && t.result.contains("options")) model["options"] = t.result["options"];
  else model["options"] = t.options;

  json events = json::array();
  json values = json::object();
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    events.push_back(event_json(e, layer_of[i]));
    if (e.value.empty()) continue;
    json& v = values[e.value];
    const bool backward = e.phase == "backward";
    if (!backward && (e.kind == "input" || e.kind == "op" || e.kind == "collective" || e.kind == "redistribute" ||
                      e.kind == "local")) {
      v["spec"] = e.out_spec;
      v["local"] = shape_runs(e.local_shapes);
      v["at"] = e.seq;
      v["layer"] = layer_of[i];
      if (e.kind == "input") v["input"] = true;
    } else if (backward && (e.kind == "grad" || e.kind == "input_grad")) {
      v["gspec"] = e.out_spec;
      v["glocal"] = shape_runs(e.local_shapes);
    }
  }
  for (auto it = values.begin(); it != values.end(); ++it) {
    json& v = it.value();
    const std::string& name = it.key();
    auto shape = f.global_shape.find(name);
    if (shape != f.global_shape.end()) v["shape"] = shape->second;
    auto grad = f.grads.find(name);
    if (grad != f.grads.end()) v["grad"] = {grad->second.first, grad->second.second};
    auto errors = f.value_errors.find(name);
    if (errors != f.value_errors.end()) v["errors"] = errors->second;
    auto gerrors = f.grad_errors.find(name);
    if (gerrors != f.grad_errors.end()) v["gerrors"] = gerrors->second;
    if (run.recorded.is_object() && run.recorded.contains(name)) v["recorded"] = run.recorded[name];
    auto src = f.sources.find(name);
    if (src != f.sources.end()) v["source"] = src->second.where;
  }
  model["events"] = std::move(events);
  model["values"] = std::move(values);
  model["graphs"] = explore_graphs(t, f, layer_of, layers);
  return model;
}

// ---------------------------------------------------------------------------------------------
// Two runs
// ---------------------------------------------------------------------------------------------

namespace {

struct ValueFacts {
  std::string spec, gspec;
  std::vector<std::vector<int64_t>> local;
  std::vector<std::string> hashes;
};

std::map<std::string, ValueFacts> value_facts(const Trace& t) {
  std::map<std::string, ValueFacts> out;
  for (const Event& e : t.events) {
    if (e.value.empty()) continue;
    ValueFacts& v = out[e.value];
    if (e.phase == "forward" && e.kind != "seed") {
      v.spec = e.out_spec;
      v.local = e.local_shapes;
      v.hashes = e.hashes;
    } else if (e.kind == "grad" || e.kind == "input_grad") {
      v.gspec = e.out_spec;
    }
  }
  return out;
}

// "forward all_gather dp 256 B of wf" -> how many times
std::map<std::string, int64_t> collective_counts(const Trace& t) {
  std::map<std::string, int64_t> out;
  for (const Event& e : t.events)
    if (e.kind == "collective")
      ++out[e.phase + " " + e.name + " " + e.axis + " " + std::to_string(e.bytes) + " B of " + e.value +
            (e.implicit.empty() ? "" : " (implicit)")];
  return out;
}

// The keys of two maps, each once, in order.
template <typename M>
std::set<std::string> union_of_keys(const M& a, const M& b) {
  std::set<std::string> keys;
  for (const auto& [k, _] : a) keys.insert(k);
  for (const auto& [k, _] : b) keys.insert(k);
  return keys;
}

}  // namespace

json explore_diff(const ExploreRun& a, const ExploreRun& b) {
  const auto va = value_facts(a.trace), vb = value_facts(b.trace);
  json values = json::array();
  for (const auto& name : union_of_keys(va, vb)) {
    auto ia = va.find(name), ib = vb.find(name);
    std::vector<std::string> what;
    if (ia == va.end()) what.push_back("only in B");
    else if (ib == vb.end()) what.push_back("only in A");
    else {
      const ValueFacts &x = ia->second, &y = ib->second;
      if (x.spec != y.spec) what.push_back("placement " + x.spec + " vs " + y.spec);
      if (x.local != y.local) what.push_back("local shapes");
      else if (x.hashes != y.hashes) what.push_back("local contents");
      if (x.gspec != y.gspec) what.push_back("gradient " + (x.gspec.empty() ? "none" : x.gspec) + " vs " +
                                             (y.gspec.empty() ? "none" : y.gspec));
    }
    if (!what.empty()) values.push_back({{"value", name}, {"what", what}});
  }
  const auto ca = collective_counts(a.trace), cb = collective_counts(b.trace);
  json collectives = json::array();
  for (const auto& k : union_of_keys(ca, cb)) {
    const int64_t na = ca.count(k) ? ca.at(k) : 0, nb = cb.count(k) ? cb.at(k) : 0;
    if (na != nb) collectives.push_back({{"collective", k}, {"a", na}, {"b", nb}});
  }
  return {{"values", values}, {"collectives", collectives}};
}

// ---------------------------------------------------------------------------------------------
// Recorded values (meshsim run --values DIR)
// ---------------------------------------------------------------------------------------------

namespace {

std::string read_bytes(const std::string& path, const std::string& index_file, const std::string& json_path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(index_file, json_path, "cannot read " + path + ": " + std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The first `limit` elements of an .npy file (little-endian f8, f4, i8, i4, b1).
json npy_head(const std::string& path, const std::string& index_file, const std::string& json_path, size_t limit) {
  const std::string data = read_bytes(path, index_file, json_path);
  auto bad = [&](const std::string& why) { return InputError(index_file, json_path, path + ": " + why); };
  if (data.size() < 10 || data.compare(0, 6, "\x93NUMPY") != 0) throw bad("not an .npy file");
  const auto major = static_cast<unsigned char>(data[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | (static_cast<size_t>(static_cast<unsigned char>(data[9])) << 8);
    start = 10;
  } else {
    if (data.size() < 12) throw bad("truncated .npy header");
    for (int k = 3; k >= 0; --k) header_len = (header_len << 8) | static_cast<unsigned char>(data[8 + k]);
    start = 12;
  }
  if (start + header_len > data.size()) throw bad("truncated .npy header");
  const std::string header = data.substr(start, header_len);
  const size_t at = header.find("'descr': '");
  if (at == std::string::npos) throw bad("no descr in the .npy header");
  const std::string descr = header.substr(at + 10, 3);
  const char* body = data.data() + start + header_len;
  const size_t size = data.size() - start - header_len;
  json head = json::array();
  auto take = [&](size_t width, auto convert) {
    for (size_t k = 0; k < limit && (k + 1) * width <= size; ++k) head.push_back(convert(body + k * width));
    return size / width;
  };
  size_t elements = 0;
  if (descr == "<f8") elements = take(8, [](const char* p) { double v; std::memcpy(&v, p, 8); return v; });
  else if (descr == "<f4") elements = take(4, [](const char* p) { float v; std::memcpy(&v, p, 4); return static_cast<double>(v); });
  else if (descr == "<i8") elements = take(8, [](const char* p) { int64_t v; std::memcpy(&v, p, 8); return v; });
  else if (descr == "<i4") elements = take(4, [](const char* p) { int32_t v; std::memcpy(&v, p, 4); return static_cast<int64_t>(v); });
  else if (descr == "|b1") elements = take(1, [](const char* p) { return *p != 0; });
  else throw bad("element type " + descr + " is not one the explorer reads (<f8, <f4, <i8, <i4, |b1)");
  // JSON has no NaN or infinity: such elements are written as text.
  for (auto& v : head)
    if (v.is_number_float() && !std::isfinite(v.get<double>())) v = std::to_string(v.get<double>());
  return {{"head", head}, {"elements", elements}};
}

}  // namespace

json read_recorded_values(const std::string& dir) {
  const std::string index_file = dir + "/index.json";
  const json index = read_json_file(index_file);
  if (!index.is_object() || !index.contains("files") || !index["files"].is_array())
    throw InputError(index_file, "/files", "expected the list of files that meshsim run --values writes");
  json out = json::object();
  const json& files = index["files"];
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = "/files/" + std::to_string(i);
    const json& entry = files[i];
    for (const char* key : {"value", "kind", "path"})
      if (!entry.is_object() || !entry.contains(key) || !entry[key].is_string())
        throw InputError(index_file, path + "/" + key, std::string("expected a string \"") + key + "\"");
    const std::string kind = entry["kind"];
    if (kind != "value" && kind != "oracle" && kind != "grad" && kind != "oracle_grad") continue;  // ranks: not shown
    const std::string rel = entry["path"];
    if (rel.find("..") != std::string::npos || (!rel.empty() && rel[0] == '/'))
      throw InputError(index_file, path + "/path", "a path outside " + dir + ": " + rel);
    json head = npy_head(dir + "/" + rel, index_file, path + "/path", kExploreRecordedElements);
    if (entry.contains("shape")) head["shape"] = entry["shape"];
    if (entry.contains("dtype")) head["dtype"] = entry["dtype"];
    out[entry["value"].get<std::string>()][kind] = std::move(head);
  }
  return out;
}

}  // namespace meshsim
