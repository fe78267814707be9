// Fuzz target: the scenario-to-diagram path of `meshsim render` (read, run on the simulator and
// the oracle, trace, draw both views as DOT; small programs also laid out by Graphviz). Limits
// keep one input fast: 64 ranks and 64 MiB estimated, as --max-ranks and --max-memory would.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/trace_of.h"
#include "core/error.h"
#include "core/resources.h"
#include "core/scenario.h"
#include "oracles/check.h"
#include "traces/render.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshsim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Scenario sc = parse_scenario(parse_json_text(text, "fuzz.json"), "fuzz.json");
    ResourceLimits limits;
    limits.max_ranks = 64;
    limits.max_bytes = 64.0 * (1 << 20);
    check_resources(sc, sc.options, limits);
    const Trace trace = trace_of(sc, sc.options, check_scenario(sc, sc.options));
    for (RenderView view : {RenderView::Logical, RenderView::Ranks}) {
      const std::string dot = render_dot(trace, view);
      if (sc.program.size() <= 16) (void)layout_dot(dot, "svg", "fuzz.svg");
    }
  } catch (const InputError&) {
  } catch (const SemanticError&) {
  }
  return 0;
}
