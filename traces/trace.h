// Traces (DESIGN.md, contract 4): the scenario, options and build of a run with its ordered events,
// read and written as JSON ("format": "meshsim.trace/1"), compared event by event for replay, and
// hashed for the determinism property.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/event.h"

namespace meshsim {

inline constexpr const char* kTraceFormat = "meshsim.trace/1";

struct Trace {
  std::string version;      // the build's version (MESHSIM_VERSION)
  nlohmann::json scenario;  // the scenario document as run (with its options)
  nlohmann::json options;   // the run options (RunOptions::to_json())
  std::vector<Event> events;
  nlohmann::json result;  // the meshsim.result/1 object of the run (may be null)

  bool operator==(const Trace& o) const {
    return version == o.version && scenario == o.scenario && options == o.options &&
           events == o.events && result == o.result;
  }
  bool operator!=(const Trace& o) const { return !(*this == o); }
};

// Every key of an event is always written, empty or not ("note": "", "bytes": 0), for stable diffs,
// but "implicit", written only where the planner inserted the step (traces without one read alike);
// reading requires every other key and rejects unknown ones, so a round trip is exact.
nlohmann::json event_to_json(const Event& event);
// Throws InputError(file, path + "/key", ...) on a missing, unknown or mistyped key.
Event event_from_json(const nlohmann::json& doc, const std::string& file, const std::string& path);

// {"format": "meshsim.trace/1", "version", "scenario", "options", "events": [...], "result"}
nlohmann::json trace_to_json(const Trace& trace);
// Throws InputError(file, json_path, message).
Trace trace_from_json(const nlohmann::json& doc, const std::string& file);

// trace_to_json(trace).dump(2) + "\n", byte for byte, built one event at a time (never the whole
// document as JSON): what write_trace writes.
std::string trace_text(const Trace& trace);
// Pretty JSON (2-space indent, sorted keys) with a trailing newline, deterministic byte for byte.
// Throws InputError(path, "", ...) when the file cannot be written.
void write_trace(const Trace& trace, const std::string& path);
// Unreadable file, invalid JSON or wrong contents: InputError naming the file and the JSON path.
Trace read_trace(const std::string& path);

// format == "meshsim.trace/1"
bool is_trace_document(const nlohmann::json& doc);

struct Divergence {
  bool diverged = false;
  int64_t index = -1;  // the first differing event (the shorter length on a length difference)
  std::string
      message;  // "event 7 (backward collective reduce_scatter of wf): hashes[2] differs: ..."
};

// The first event, in order, where recorded and replayed differ, naming the field and both values.
Divergence compare_events(const std::vector<Event>& recorded, const std::vector<Event>& replayed);

// FNV-1a 64 over the canonical (compact, sorted-key) JSON dump of the events.
uint64_t trace_hash(const Trace& trace);

}  // namespace meshsim
