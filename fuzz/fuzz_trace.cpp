// Fuzz target: the trace reader (bytes -> strict JSON -> trace), then what replay does with a
// trace that reads: write it back, read that again, and compare the two event by event.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/files.h"
#include "traces/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshsim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Trace t = trace_from_json(parse_json_text(text, "fuzz.trace.json"), "fuzz.trace.json");
    // A trace that reads writes back to one that reads the same (a bug otherwise: abort).
    const Trace again = trace_from_json(parse_json_text(trace_to_json(t).dump(), "again.json"), "again.json");
    if (compare_events(t.events, again.events).diverged || trace_hash(t) != trace_hash(again)) std::abort();
  } catch (const InputError&) {
  } catch (const SemanticError&) {
  }
  return 0;
}
