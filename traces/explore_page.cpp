// The explorer's page (explore.h): the model as JSON in a <script> element, the script and the
// style written in traces/explore/ and inlined at build time (explore_assets.h). A content
// security policy forbids the page every request: it is whole without the network.
#include <string>
#include <vector>

#include "traces/explore.h"
#include "traces/explore_assets.h"

namespace meshsim {

namespace {

// JSON inside <script>: "</" would end the element; "<\/" is the same JSON string.
std::string script_safe(const std::string& json_text) {
  std::string out;
  out.reserve(json_text.size() + json_text.size() / 32);
  for (size_t i = 0; i < json_text.size(); ++i) {
    out += json_text[i];
    if (json_text[i] == '<' && i + 1 < json_text.size() && json_text[i + 1] == '/') out += '\\';
  }
  return out;
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string explore_html(const std::vector<ExploreRun>& runs) {
  nlohmann::json doc = {{"format", "meshsim.explore/1"}, {"runs", nlohmann::json::array()}, {"diff", nullptr}};
  for (const auto& run : runs) doc["runs"].push_back(explore_model(run));
  if (runs.size() == 2) doc["diff"] = explore_diff(runs[0], runs[1]);
  std::string title = "meshsim explore: " + doc["runs"][0].value("name", std::string("run"));
  if (runs.size() == 2) title += " vs " + doc["runs"][1].value("name", std::string("run"));
  std::string page;
  page += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
          "script-src 'unsafe-inline'; img-src data:\">\n";
  page += "<title>" + html_escape(title) + "</title>\n<style>\n";
  page += explore_assets::kCss;
  page += "</style>\n</head>\n<body>\n<script type=\"application/json\" id=\"meshsim-model\">";
  page += script_safe(doc.dump());
  page += "</script>\n<script>\n";
  page += explore_assets::kJs;
  page += "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace meshsim
