#include "traces/trace.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace meshsim {

using nlohmann::json;

namespace {

// The keys of an event, in the order of Event's fields.
const std::vector<std::string> kEventKeys = {
    "seq",      "phase", "kind",  "name",         "value",  "args", "in_specs",
    "out_spec", "axis",  "bytes", "local_shapes", "hashes", "note", "implicit"};
const std::vector<std::string> kTraceKeys = {"format",  "version", "scenario",
                                             "options", "events",  "result"};

// A JSON value in an error message, cut short.
std::string brief(const json& v) {
  const std::string text = v.dump();
  return text.size() <= 40 ? text : text.substr(0, 37) + "...";
}

// Reads typed fields of one JSON object; every error names the file and the JSON path.
class Reader {
 public:
  Reader(const json& doc, const std::string& file, const std::string& path)
      : doc_(doc), file_(file), path_(path) {
    if (!doc.is_object()) fail("", "expected an object");
  }

  void only_keys(const std::vector<std::string>& keys) const {
    for (const auto& item : doc_.items()) {
      if (std::find(keys.begin(), keys.end(), item.key()) == keys.end())
        fail("/" + item.key(), "unknown key");
    }
  }
  const json& at(const std::string& key) const {
    auto it = doc_.find(key);
    if (it == doc_.end()) fail("/" + key, "missing key");
    return *it;
  }
  std::string str(const std::string& key) const { return as_string(at(key), "/" + key); }
  int64_t int64(const std::string& key) const { return as_int(at(key), "/" + key); }
  std::vector<std::string> strings(const std::string& key) const {
    return elements<std::string>(
        at(key), "/" + key, [&](const json& v, const std::string& p) { return as_string(v, p); });
  }
  std::vector<std::vector<int64_t>> shapes(const std::string& key) const {
    return elements<std::vector<int64_t>>(
        at(key), "/" + key, [&](const json& v, const std::string& p) {
          return elements<int64_t>(
              v, p, [&](const json& d, const std::string& q) { return as_int(d, q); });
        });
  }
  const json& object(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_object()) fail("/" + key, "expected an object");
    return v;
  }
  [[noreturn]] void fail(const std::string& sub, const std::string& message) const {
    throw InputError(file_, path_ + sub, message);
  }

 private:
  std::string as_string(const json& v, const std::string& sub) const {
    if (!v.is_string()) fail(sub, "expected a string, got " + brief(v));
    return v.get<std::string>();
  }
  int64_t as_int(const json& v, const std::string& sub) const {
    if (!v.is_number_integer()) fail(sub, "expected an integer, got " + brief(v));
    return v.get<int64_t>();
  }
  template <typename T, typename F>
  std::vector<T> elements(const json& v, const std::string& sub, F read) const {
    if (!v.is_array()) fail(sub, "expected an array, got " + brief(v));
    std::vector<T> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(read(v[i], sub + "/" + std::to_string(i)));
    return out;
  }

  const json& doc_;
  std::string file_, path_;
};

// A value as a message shows it: strings bare, everything else as compact JSON.
std::string show(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "event 7 (backward collective reduce_scatter of wf)"
std::string describe(int64_t index, const Event& e) {
  std::string out = "event " + std::to_string(index) + " (" + e.phase + " " + e.kind;
  if (!e.name.empty()) out += " " + e.name;
  if (!e.value.empty() && e.value != e.name) out += " of " + e.value;
  return out + ")";
}

// The first difference of one field: "hashes[2] differs: recorded 3f.. replayed 9a..".
std::string field_difference(const std::string& key, const json& a, const json& b) {
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (a[i] != b[i]) {
        return key + "[" + std::to_string(i) + "] differs: recorded " + show(a[i]) + " replayed " +
               show(b[i]);
      }
    }
    return key + " has " + std::to_string(a.size()) + " entries recorded, " +
           std::to_string(b.size()) + " replayed";
  }
  return key + " differs: recorded " + show(a) + " replayed " + show(b);
}

std::string first_field_difference(const Event& recorded, const Event& replayed) {
  json a = event_to_json(recorded), b = event_to_json(replayed);
  for (const auto& key : kEventKeys) {
    if (key == "implicit") continue;  // an annotation, not compared (core/event.h)
    if (a[key] != b[key]) return field_difference(key, a[key], b[key]);
  }
  return "";
}

json events_to_json(const std::vector<Event>& events) {
  json out = json::array();
  for (const auto& e : events) out.push_back(event_to_json(e));
  return out;
}

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

json event_to_json(const Event& e) {
  json doc = {{"seq", e.seq},
          {"phase", e.phase},
          {"kind", e.kind},
          {"name", e.name},
          {"value", e.value},
          {"args", e.args},
          {"in_specs", e.in_specs},
          {"out_spec", e.out_spec},
          {"axis", e.axis},
          {"bytes", e.bytes},
          {"local_shapes", e.local_shapes},
          {"hashes", e.hashes},
          {"note", e.note}};
  if (!e.implicit.empty()) doc["implicit"] = e.implicit;
  return doc;
}

Event event_from_json(const json& doc, const std::string& file, const std::string& path) {
  Reader r(doc, file, path);
  r.only_keys(kEventKeys);
  Event e;
  e.seq = r.int64("seq");
  e.phase = r.str("phase");
  e.kind = r.str("kind");
  e.name = r.str("name");
  e.value = r.str("value");
  e.args = r.strings("args");
  e.in_specs = r.strings("in_specs");
  e.out_spec = r.str("out_spec");
  e.axis = r.str("axis");
  e.bytes = r.int64("bytes");
  e.local_shapes = r.shapes("local_shapes");
  e.hashes = r.strings("hashes");
  e.note = r.str("note");
  if (doc.contains("implicit")) e.implicit = r.str("implicit");  // written only where set
  return e;
}

json trace_to_json(const Trace& trace) {
  return {{"format", kTraceFormat},
          {"version", trace.version},
          {"scenario", trace.scenario},
          {"options", trace.options},
          {"events", events_to_json(trace.events)},
          {"result", trace.result}};
}

bool is_trace_document(const json& doc) {
  return doc.is_object() && doc.contains("format") && doc["format"] == kTraceFormat;
}

Trace trace_from_json(const json& doc, const std::string& file) {
  Reader r(doc, file, "");
  if (r.str("format") != kTraceFormat) {
    r.fail("/format",
           "expected \"" + std::string(kTraceFormat) + "\", got " + brief(r.at("format")));
  }
  r.only_keys(kTraceKeys);
  Trace trace;
  trace.version = r.str("version");
  trace.scenario = r.object("scenario");
  trace.options = r.object("options");
  const json& events = r.at("events");
  if (!events.is_array()) r.fail("/events", "expected an array, got " + brief(events));
  for (size_t i = 0; i < events.size(); ++i) {
    trace.events.push_back(event_from_json(events[i], file, "/events/" + std::to_string(i)));
  }
  trace.result = r.at("result");
  if (!trace.result.is_object() && !trace.result.is_null())
    r.fail("/result", "expected an object or null");
  return trace;
}

namespace {

// `value` pretty-printed as it stands `depth` levels down in a document dump(2) prints: each line
// after the first indented by 2 * depth spaces (a string in JSON never holds a raw newline).
void append_nested(std::string& out, const json& value, int depth) {
  const std::string text = value.dump(2);
  const std::string indent(static_cast<size_t>(2 * depth), ' ');
  out.reserve(out.size() + text.size());
  for (char c : text) {
    out += c;
    if (c == '\n') out += indent;
  }
}

}  // namespace

std::string trace_text(const Trace& trace) {
  // trace_to_json(trace).dump(2) + "\n", byte for byte, without the whole document in memory at
  // once: one event's JSON at a time (a long program's trace holds hundreds of thousands). The
  // top-level keys in dump's (sorted) order.
  std::string out = "{\n  \"events\": ";
  if (trace.events.empty()) {
    out += "[]";
  } else {
    out += "[\n";
    for (size_t i = 0; i < trace.events.size(); ++i) {
      out += "    ";
      append_nested(out, event_to_json(trace.events[i]), 2);
      out += i + 1 < trace.events.size() ? ",\n" : "\n";
    }
    out += "  ]";
  }
  out += ",\n  \"format\": ";
  append_nested(out, kTraceFormat, 1);
  out += ",\n  \"options\": ";
  append_nested(out, trace.options, 1);
  out += ",\n  \"result\": ";
  append_nested(out, trace.result, 1);
  out += ",\n  \"scenario\": ";
  append_nested(out, trace.scenario, 1);
  out += ",\n  \"version\": ";
  append_nested(out, trace.version, 1);
  out += "\n}\n";
  return out;
}

void write_trace(const Trace& trace, const std::string& path) { write_file_atomically(path, trace_text(trace)); }

Trace read_trace(const std::string& path) { return trace_from_json(read_json_file(path), path); }

Divergence compare_events(const std::vector<Event>& recorded, const std::vector<Event>& replayed) {
  const size_t common = std::min(recorded.size(), replayed.size());
  for (size_t i = 0; i < common; ++i) {
    if (recorded[i] != replayed[i]) {
      const auto index = static_cast<int64_t>(i);
      return {
          true, index,
          describe(index, recorded[i]) + ": " + first_field_difference(recorded[i], replayed[i])};
    }
  }
  if (recorded.size() == replayed.size()) return {};
  const auto index = static_cast<int64_t>(common);
  const bool missing = recorded.size() > replayed.size();
  const Event& extra = missing ? recorded[common] : replayed[common];
  return {true, index,
          describe(index, extra) +
              (missing ? ": missing from the replay" : ": extra in the replay") + " (recorded " +
              std::to_string(recorded.size()) + " events, replayed " +
              std::to_string(replayed.size()) + ")"};
}

uint64_t trace_hash(const Trace& trace) { return fnv1a64(events_to_json(trace.events).dump()); }

}  // namespace meshsim
