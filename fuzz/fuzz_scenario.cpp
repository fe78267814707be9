// Fuzz target: the scenario reader (bytes -> strict JSON -> scenario -> resource estimate).
// Anything but InputError, SemanticError or a clean return is a bug of meshsim's.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/resources.h"
#include "core/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshsim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    Scenario sc = parse_scenario(parse_json_text(text, "fuzz.json"), "fuzz.json");
    const RunOptions options = with_overrides(sc.options, {});
    (void)estimate_resources(sc, options);
    check_resources(sc, options, ResourceLimits{});
  } catch (const InputError&) {
  } catch (const SemanticError&) {
  }
  return 0;
}
