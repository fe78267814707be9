// The explorer's graphs (explore.h): the forward program folded by layer and each layer's ops,
// written as DOT here and laid out to SVG by Graphviz's dot.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "traces/render_common.h"

namespace meshsim {

// {"overview": SVG (one node per layer, the ops outside every layer), "layers": [SVG per layer],
//  "nodes": how many op and input nodes; "note": why a graph was not laid out, when it was not}.
// layer_of: each event's layer (an index into `layers`, -1 for none).
nlohmann::json explore_graphs(const Trace& t, const render_detail::Facts& f, const std::vector<int>& layer_of,
                              const std::vector<std::string>& layers);

// The DOT text of those graphs, before layout (for tests): the overview, then each layer's.
std::vector<std::string> explore_dots(const Trace& t, const render_detail::Facts& f, const std::vector<int>& layer_of,
                                      const std::vector<std::string>& layers);

}  // namespace meshsim
