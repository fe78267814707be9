#include "cli/expect.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace meshsim::cli {

namespace {

using json = nlohmann::json;

const std::vector<std::string> kStatuses = {"pass", "fail", "error", "unchecked"};
// What a run records as a collective event (sim/runtime.cpp, sim/local_map.cpp).
const std::vector<std::string> kPhases = {"forward", "backward"};
const std::vector<std::string> kCollectiveOps = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"};

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// JSON pointer escaping of one key (RFC 6901).
std::string token(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

std::vector<std::string> error_kinds() {
  std::vector<std::string> out;
  // OutSpecMismatch is the last kind of core/error.h.
  for (int k = 0; k <= static_cast<int>(ErrorKind::OutSpecMismatch); ++k)
    out.push_back(error_kind_name(static_cast<ErrorKind>(k)));
  return out;
}

class ExpectReader {
 public:
  explicit ExpectReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw InputError(file_, path, message);
  }
  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "expected an object, got " + v.dump());
    return v;
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array, got " + v.dump());
    return v;
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::string one_of(const json& v, const std::string& path, const std::vector<std::string>& choices) const {
    std::string s = string(v, path);
    if (std::find(choices.begin(), choices.end(), s) == choices.end())
      fail(path, "expected one of " + join(choices) + ", got \"" + s + "\"");
    return s;
  }
  int64_t count(const json& v, const std::string& path) const {
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())
                                             : v.is_number_integer() && v.get<int64_t>() >= 0;
    if (!fits) fail(path, "expected a non-negative integer, got " + v.dump());
    return v.get<int64_t>();
  }
  void only_keys(const json& obj, const std::string& path, const std::vector<std::string>& allowed) const {
    for (const auto& item : obj.items())
      if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end())
        fail(path + "/" + token(item.key()), "unknown field \"" + item.key() + "\" (expected " + join(allowed) + ")");
  }

 private:
  std::string file_;
};

CollectiveExpectation parse_collective(const ExpectReader& r, const json& c, const std::string& path,
                                       const Mesh& mesh) {
  r.object(c, path);
  r.only_keys(c, path, {"phase", "op", "axis", "value", "count", "bytes"});
  CollectiveExpectation out;
  out.path = path;
  if (c.contains("phase")) out.phase = r.one_of(c["phase"], path + "/phase", kPhases);
  if (c.contains("op")) out.op = r.one_of(c["op"], path + "/op", kCollectiveOps);
  if (c.contains("axis")) out.axis = r.one_of(c["axis"], path + "/axis", mesh.axes());
  if (c.contains("value")) out.value = r.string(c["value"], path + "/value");
  if (c.contains("count")) out.count = r.count(c["count"], path + "/count");
  if (c.contains("bytes")) out.bytes = r.count(c["bytes"], path + "/bytes");
  if (!out.count && !out.bytes) r.fail(path, "expected \"count\" or \"bytes\" (or both)");
  return out;
}

// "backward reduce_scatter over tp (value wf)"; what a matcher leaves open reads "any".
std::string describe(const CollectiveExpectation& c) {
  std::string out = (c.phase.empty() ? "any phase" : c.phase) + " " + (c.op.empty() ? "collective" : c.op);
  if (!c.axis.empty()) out += " over " + c.axis;
  if (!c.value.empty()) out += " of " + c.value;
  return out;
}

std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// The result's field `key` when it has the type of `empty` (an object or an array), else `empty`.
const json& part(const json& result, const char* key, const json& empty) {
  auto it = result.find(key);
  return it != result.end() && it->type() == empty.type() ? *it : empty;
}

std::string check_text(const json& v) { return v.is_boolean() ? (v.get<bool>() ? "true" : "false") : "unchecked"; }

}  // namespace

std::optional<Expectation> parse_expectation(const Scenario& sc) {
  if (sc.expect.is_null()) return std::nullopt;
  const ExpectReader r(sc.file);
  const json& e = r.object(sc.expect, "/expect");
  r.only_keys(e, "/expect", {"status", "error", "checks", "collectives", "failures", "exit", "implicit",
                                  "recorded_differences"});
  if (e.empty())
    r.fail("/expect", "expected at least one of status, error, checks, collectives, failures, exit, implicit, recorded_differences");
  Expectation out;
  if (e.contains("status")) out.status = r.one_of(e["status"], "/expect/status", kStatuses);
  if (e.contains("error")) {
    out.error = r.one_of(e["error"], "/expect/error", error_kinds());
    if (out.status && *out.status != "error")
      r.fail("/expect/error", "an error kind needs status \"error\" (status is \"" + *out.status + "\")");
  }
  if (e.contains("checks"))
    for (const auto& [name, v] : r.object(e["checks"], "/expect/checks").items()) {
      if (!v.is_boolean()) r.fail("/expect/checks/" + token(name), "expected true or false, got " + v.dump());
      out.checks.emplace_back(name, v.get<bool>());
    }
  if (e.contains("collectives")) {
    const json& cs = r.array(e["collectives"], "/expect/collectives");
    for (size_t i = 0; i < cs.size(); ++i)
      out.collectives.push_back(parse_collective(r, cs[i], "/expect/collectives/" + std::to_string(i), sc.mesh));
  }
  if (e.contains("failures")) {
    const json& fs = r.array(e["failures"], "/expect/failures");
    for (size_t i = 0; i < fs.size(); ++i)
      out.failures.push_back(r.string(fs[i], "/expect/failures/" + std::to_string(i)));
  }
  if (e.contains("exit")) {
    const std::string path = "/expect/exit";
    const int64_t code = r.count(e["exit"], path);
    if (code > 3) r.fail(path, "expected an exit code of meshsim run: 0, 1, 2 or 3, got " + e["exit"].dump());
    out.exit = static_cast<int>(code);
  }
  if (e.contains("implicit")) out.implicit = r.count(e["implicit"], "/expect/implicit");
  if (e.contains("recorded_differences"))
    out.recorded_differences = r.count(e["recorded_differences"], "/expect/recorded_differences");
  return out;
}

std::vector<std::string> unmet_expectations(const Expectation& e, const json& result, int exit_code) {
  static const json kNoObject = json::object(), kNoArray = json::array();
  std::vector<std::string> unmet;
  const std::string status = result.value("status", "");
  if (e.status || e.error) {
    const std::string want = e.status ? *e.status : "error";
    if (status != want) unmet.push_back("/expect/status: expected " + want + ", found " + status);
  } else if (status != "pass" && status != "unchecked") {
    unmet.push_back("/expect/status: expected pass (the default without status), found " + status);
  }
  if (e.error) {
    const std::string kind = part(result, "error", kNoObject).value("kind", "");
    if (kind != *e.error)
      unmet.push_back("/expect/error: expected " + *e.error + ", found " + (kind.empty() ? "none" : kind));
  }
  const json& checks = part(result, "checks", kNoObject);
  for (const auto& [name, want] : e.checks) {
    const std::string head = "/expect/checks/" + token(name) + ": expected " + (want ? "true" : "false") + ", found ";
    if (!checks.contains(name)) {
      std::vector<std::string> have;
      for (const auto& item : checks.items()) have.push_back(item.key());
      unmet.push_back(head + "no such check (the run has: " + (have.empty() ? "none" : join(have)) + ")");
    } else if (checks[name] != want) {
      unmet.push_back(head + check_text(checks[name]));
    }
  }
  const json& collectives = part(result, "collectives", kNoArray);
  for (const auto& c : e.collectives) {
    int64_t count = 0, bytes = 0;
    auto matches = [&](const json& got, const char* key, const std::string& want) {
      return want.empty() || (got.contains(key) && got[key] == want);
    };
    for (const auto& got : collectives)
      if (got.is_object() && matches(got, "phase", c.phase) && matches(got, "op", c.op) &&
          matches(got, "axis", c.axis) && matches(got, "value", c.value)) {
        ++count;
        if (got.contains("bytes") && got["bytes"].is_number_integer()) bytes += got["bytes"].get<int64_t>();
      }
    if ((!c.count || *c.count == count) && (!c.bytes || *c.bytes == bytes)) continue;
    std::string want = c.count ? std::to_string(*c.count) : "";
    if (c.bytes) want += (c.count ? " with " : "") + std::to_string(*c.bytes) + " B";
    unmet.push_back(c.path + ": " + describe(c) + ": expected " + want + ", found " + std::to_string(count) + " (" +
                    std::to_string(bytes) + " B)");
  }
  const json& failures = part(result, "failures", kNoArray);
  for (size_t i = 0; i < e.failures.size(); ++i) {
    const bool found = std::any_of(failures.begin(), failures.end(),
                                   [&](const json& f) { return text(f).find(e.failures[i]) != std::string::npos; });
    if (!found)
      unmet.push_back("/expect/failures/" + std::to_string(i) + ": no failure contains \"" + e.failures[i] + "\"" +
                      (failures.empty() ? " (the run has no failures)" : ""));
  }
  if (e.implicit) {
    int64_t found = 0;
    std::string first;
    for (const auto& m : part(result, "implicit", kNoArray))
      if (m.is_object() && m.contains("collectives") && m["collectives"].is_array() && !m["collectives"].empty()) {
        ++found;
        if (first.empty()) first = text(m.value("reason", json("")));
      }
    if (found != *e.implicit)
      unmet.push_back("/expect/implicit: expected " + std::to_string(*e.implicit) +
                      " implicit redistributions that communicate, found " + std::to_string(found) +
                      (first.empty() ? "" : " (the first: " + first + ")"));
  }
  if (e.recorded_differences) {
    const json& rec = part(result, "recorded", kNoObject);
    const json& diffs = part(rec, "differences", kNoArray);
    const int64_t found = static_cast<int64_t>(diffs.size());
    if (found != *e.recorded_differences)
      unmet.push_back("/expect/recorded_differences: expected " + std::to_string(*e.recorded_differences) +
                      " places where meshsim chooses otherwise than the recorded system, found " + std::to_string(found) +
                      (diffs.empty() ? (result.contains("recorded") ? ""
                                        : result.contains("checks") ? " (the scenario records no choices)"
                                                                    : " (the run stopped before any comparison)")
                                     : " (the first: " + text(diffs[0].value("message", json(""))) + ")"));
  }
  if (e.exit && *e.exit != exit_code)
    unmet.push_back("/expect/exit: expected " + std::to_string(*e.exit) + ", found " + std::to_string(exit_code));
  return unmet;
}

}  // namespace meshsim::cli
