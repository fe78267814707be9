// The user's own scenario as a property (`meshsim check --scenario FILE`): the same program over
// random mesh sizes, input shapes, input placements and run options, checked against the oracle.
#pragma once

#include <string>

#include "core/resources.h"
#include "properties/properties.h"

namespace meshsim {

// Named "scenario:" + path. The first case of every run is the scenario as written; the others vary
// it (see scenario_property.cpp for what is drawn and what a discard is). A failing case leaves its
// scenario and options in latest_failure(). Throws InputError naming the file and JSON path when
// the file cannot be read or is not a valid scenario, and SemanticError when the scenario as
// written is over `limits` (ResourceLimit, as meshsim run refuses it) or runs out of memory
// (OutOfMemory). A variant over `limits` is a discard; memory that runs out in a case ends the
// property as out of memory (out_of_memory_in_case), never as a failure.
Property scenario_property(const std::string& path, const ResourceLimits& limits);

}  // namespace meshsim
