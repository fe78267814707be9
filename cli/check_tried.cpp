#include "cli/check_tried.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <sstream>

namespace meshsim::cli {

// What a property tried, for the report: its discards by reason (most first), the meshes its cases
// ran on (the most used, with a count of the others) and the ranks and extents of their inputs.
std::vector<std::string> tried_lines(const CaseStats& s, int cases, int discards) {
  std::vector<std::string> out;
  auto most_first = [](const std::map<std::string, int64_t>& counts) {
    std::vector<std::pair<std::string, int64_t>> v(counts.begin(), counts.end());
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return v;
  };
  if (discards > 0) {
    std::string line = "discarded " + std::to_string(discards) + ":";
    const char* sep = " ";
    for (const auto& [reason, n] : most_first(s.discards)) {
      line += sep + std::to_string(n) + " " + reason;
      sep = ", ";
    }
    out.push_back(line);
  }
  if (s.meshes.empty()) {
    if (cases > 0) out.push_back("meshes and shapes: not noted (no scenario or layout in its cases)");
    return out;
  }
  size_t min_axes = SIZE_MAX, max_axes = 0;
  int64_t min_ranks = INT64_MAX, max_ranks = 0;
  for (const auto& [key, n] : s.meshes) {
    if (key.find_first_not_of("0123456789x") != std::string::npos) continue;  // "0-d"
    int64_t ranks = 1;  // a key is the axis sizes joined by 'x' ("2x3")
    std::stringstream in(key);
    for (std::string size; std::getline(in, size, 'x');) ranks *= std::stoll(size);
    const size_t axes = static_cast<size_t>(std::count(key.begin(), key.end(), 'x')) + 1;
    min_axes = std::min(min_axes, axes), max_axes = std::max(max_axes, axes);
    min_ranks = std::min(min_ranks, ranks), max_ranks = std::max(max_ranks, ranks);
  }
  auto range = [](auto lo, auto hi) { return lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi); };
  std::string meshes = "meshes: " + std::to_string(s.meshes.size()) + " shapes";
  if (max_axes > 0)
    meshes += ", " + range(min_axes, max_axes) + (max_axes == 1 ? " axis, " : " axes, ") + range(min_ranks, max_ranks) +
              (max_ranks == 1 ? " rank" : " ranks");
  meshes += ";";
  const auto ranked = most_first(s.meshes);
  const size_t shown = std::min<size_t>(ranked.size(), 6);
  for (size_t i = 0; i < shown; ++i)
    meshes += (i ? ", " : " ") + ranked[i].first + " (" + std::to_string(ranked[i].second) + ")";
  if (ranked.size() > shown) meshes += " and " + std::to_string(ranked.size() - shown) + " more";
  out.push_back(meshes);
  std::string shapes;
  if (!s.ranks.empty())
    shapes = "inputs of rank " + range(s.ranks.begin()->first, s.ranks.rbegin()->first) + ", extents " +
             range(s.extent_min < 0 ? 0 : s.extent_min, s.extent_max < 0 ? 0 : s.extent_max) + ", ";
  else
    shapes = "no inputs, ";
  shapes += "uneven shards in " + std::to_string(s.uneven) + " of " + std::to_string(s.described) + " cases";
  if (s.described < cases) shapes += " (" + std::to_string(cases - s.described) + " more noted no layout)";
  out.push_back(shapes);
  // The planner's communication the program did not ask for (noted by --scenario's variants).
  if (s.implicit_cases > 0) {
    std::string line = "implicit communication in " + std::to_string(s.implicit_cases) + " of " +
                        std::to_string(cases) + " cases:";
    const auto ranked_implicit = most_first(s.implicit);
    const size_t listed = std::min<size_t>(ranked_implicit.size(), 3);
    for (size_t i = 0; i < listed; ++i)
      line += (i ? "; " : " ") + ranked_implicit[i].first + " (" + std::to_string(ranked_implicit[i].second) + ")";
    if (ranked_implicit.size() > listed)
      line += " and " + std::to_string(ranked_implicit.size() - listed) + " more (--json lists them)";
    out.push_back(line);
  }
  return out;
}

// The same in meshsim.check/1: "discard_reasons", "meshes" and "shapes" of a property.
void add_tried(nlohmann::json& jp, const CaseStats& s) {
  jp["discard_reasons"] = s.discards;
  jp["meshes"] = s.meshes;
  nlohmann::json ranks = nlohmann::json::object();
  for (const auto& [r, n] : s.ranks) ranks[std::to_string(r)] = n;
  jp["shapes"] = {{"cases", s.described},
                  {"ranks", ranks},
                  {"extent_min", s.extent_min < 0 ? nlohmann::json(nullptr) : nlohmann::json(s.extent_min)},
                  {"extent_max", s.extent_max < 0 ? nlohmann::json(nullptr) : nlohmann::json(s.extent_max)},
                  {"uneven_cases", s.uneven}};
  jp["implicit"] = s.implicit;  // what the planner inserted, counted in cases (--scenario)
  jp["implicit_cases"] = s.implicit_cases;
}

}  // namespace meshsim::cli
