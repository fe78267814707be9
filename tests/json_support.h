// Editing a JSON document by JSON pointer, for tests that derive bad scenario files from good ones.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace meshsim::testing {

// `doc` with the value at JSON pointer `at` replaced (or added).
inline nlohmann::json with(nlohmann::json doc, const std::string& at, nlohmann::json value) {
  doc[nlohmann::json::json_pointer(at)] = std::move(value);
  return doc;
}

// `doc` without the value at JSON pointer `at`.
inline nlohmann::json without(nlohmann::json doc, const std::string& at) {
  nlohmann::json::json_pointer p(at);
  doc[p.parent_pointer()].erase(p.back());
  return doc;
}

}  // namespace meshsim::testing
