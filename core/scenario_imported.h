// Reading the fields of imported programs (`source`, `recorded`, `imported`; docs/import.md).
// Each throws InputError naming `file` and the JSON path.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/scenario.h"

namespace meshsim {

SourceRef parse_source(const nlohmann::json& v, const std::string& path, const std::string& file);
// `recorded` of an op with `n_args` operands and `n_outs` results.
RecordedChoice parse_recorded(const nlohmann::json& v, const std::string& path, const std::string& file,
                              const Mesh& mesh, size_t n_args, size_t n_outs, const std::string& op);
// Every `source` of a scenario (inputs, program ops, local_map body ops), by JSON path and by the
// name of each value it made; empty maps for a scenario without sources.
struct SourceIndex {
  std::map<std::string, const SourceRef*> by_path, by_value;
};
SourceIndex index_sources(const Scenario& sc);

ImportedFrom parse_imported(const nlohmann::json& v, const std::string& path, const std::string& file);

}  // namespace meshsim
