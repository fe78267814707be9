// What a property's cases tried, as `meshsim check` reports it: the discards by reason, the meshes
// and input shapes its cases ran on, and the planner's implicit communication its scenarios needed
// (properties/runner.h, CaseStats), in text lines and in meshsim.check/1.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "properties/runner.h"

namespace meshsim::cli {

// The report's lines under a property.
std::vector<std::string> tried_lines(const CaseStats& s, int cases, int discards);
// The same in meshsim.check/1: "discard_reasons", "meshes", "shapes", "implicit" and
// "implicit_cases" of a property.
void add_tried(nlohmann::json& jp, const CaseStats& s);

}  // namespace meshsim::cli
