// Checked access to a scenario document (internal to core): every failure is an InputError naming
// the file and the JSON path. Used by core/scenario.cpp and core/scenario_imported.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim::scenario_detail {

using json = nlohmann::json;

inline std::string brief(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

inline std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// ---- checked access to the document: every failure is an InputError at a JSON path ----

// JSON pointer escaping of one key (RFC 6901).
inline std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

// A key of the user's in a path: escaped and bounded as messages show it (core/error.h, shown).
inline std::string child(const std::string& path, const std::string& key) {
  return path + "/" + shown(pointer_token(key));
}
inline std::string child(const std::string& path, size_t index) {
  return path + "/" + std::to_string(index);
}

inline std::string in_quotes(const std::string& s) { return "\"" + shown(s) + "\""; }

// The longest name a scenario may give a value, an axis or an input.
inline constexpr size_t kMaxNameBytes = 256;

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message,
                         ErrorKind kind = ErrorKind::InvalidScenario) const {
    throw InputError(file_, path.empty() ? "/" : path, message, kind);
  }

  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, "expected an object, got " + brief(v));
    return v;
  }
  const json& array(const json& v, const std::string& path) const {
    if (!v.is_array()) fail(path, "expected an array, got " + brief(v));
    return v;
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, got " + brief(v));
    return v.get<std::string>();
  }
  std::string name(const json& v, const std::string& path) const {
    std::string s = string(v, path);
    if (s.empty()) fail(path, "expected a non-empty name");
    if (s.size() > kMaxNameBytes)
      fail(path, "a name of at most " + std::to_string(kMaxNameBytes) + " bytes expected, got " + in_quotes(s));
    for (char c : s)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        fail(path, "a name without control characters expected, got " + in_quotes(s));
    return s;
  }
  bool boolean(const json& v, const std::string& path) const {
    if (!v.is_boolean()) fail(path, "expected true or false, got " + brief(v));
    return v.get<bool>();
  }
  int64_t integer(const json& v, const std::string& path,
                  int64_t min = std::numeric_limits<int64_t>::min()) const {
    bool fits = v.is_number_integer() &&
                (!v.is_number_unsigned() ||
                 v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!fits) fail(path, "expected an integer, got " + brief(v));
    int64_t i = v.get<int64_t>();
    if (i < min) fail(path, "expected an integer >= " + std::to_string(min) + ", got " + brief(v));
    return i;
  }
  void number(const json& v, const std::string& path) const {
    if (!v.is_number()) fail(path, "expected a number, got " + brief(v));
  }

  // The field `key` of an object already checked with object(); missing fields fail.
  const json& field(const json& obj, const std::string& path, const std::string& key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(child(path, key), "missing required field " + in_quotes(key));
    return *it;
  }
  // Every key of `obj` must be one of `allowed`.
  void only_keys(const json& obj, const std::string& path,
                 const std::vector<std::string>& allowed) const {
    for (const auto& item : obj.items())
      if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end())
        fail(child(path, item.key()),
             "unknown field " + in_quotes(item.key()) + " (expected " + join(allowed) + ")");
  }

  Shape shape(const json& v, const std::string& path, int64_t min_extent) const {
    Shape out;
    int64_t count = 1;
    array(v, path);
    for (size_t k = 0; k < v.size(); ++k) {
      int64_t extent = integer(v[k], child(path, k), min_extent);
      if (extent != 0 && count > std::numeric_limits<int64_t>::max() / extent)
        fail(path, "too many elements");
      count *= extent == 0 ? 1 : extent;
      out.push_back(extent);
    }
    return out;
  }

  // One placement per mesh axis; each parsed by parse_placement.
  Spec spec(const json& v, const std::string& path, const Mesh& mesh) const {
    if (array(v, path).size() != static_cast<size_t>(mesh.ndim()))
      fail(path, "expected " + std::to_string(mesh.ndim()) + " placements (one per mesh axis " +
                     join(mesh.axes()) + "), got " + std::to_string(v.size()));
    Spec out;
    for (size_t k = 0; k < v.size(); ++k) {
      std::string text = string(v[k], child(path, k));
      try {
        out.push_back(parse_placement(text));
      } catch (const std::invalid_argument& e) {
        fail(child(path, k), e.what());
      }
      // A norm's partial is a vector norm's result over a sharded dim; its parts cannot be
      // written or made from other placements (PyTorch makes _NormPartial only in the norm ops).
      if (out.back().is_norm_partial())
        fail(child(path, k), "\"" + text + "\" is the partial a vector norm over a sharded dim gives; a scenario "
                             "does not write it (redistribute the norm's result to R or S(d) instead)");
    }
    return out;
  }

  void check_shape(const Mesh& mesh, const Spec& spec, size_t ndim, const std::string& path) const {
    std::string why = check_spec(mesh, spec, static_cast<int64_t>(ndim));
    if (!why.empty()) fail(path, why, ErrorKind::ShapeMismatch);
  }

 private:
  std::string file_;
};

// The float dtypes' spellings for a message: "float64, float32, bfloat16 or float16"
// (core/run_options.cpp).
std::string dtype_choices();

}  // namespace meshsim::scenario_detail
