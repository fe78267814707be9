// The user's own scenario as a property (`meshsim check --scenario FILE`): the same program over
// random mesh sizes, input shapes, input placements and run options, checked against the oracle.
#pragma once

#include <string>

#include "properties/properties.h"

namespace meshsim {

// Named "scenario:" + path. The first case of every run is the scenario as written; the others vary
// it (see scenario_property.cpp for what is drawn and what a discard is). A failing case leaves its
// scenario and options in latest_failure(). Throws InputError naming the file and JSON path when
// the file cannot be read or is not a valid scenario.
Property scenario_property(const std::string& path);

}  // namespace meshsim
