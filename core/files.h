// Reading JSON strictly and writing files whole: the input side and the output side of every file
// meshsim touches (DESIGN.md, contracts 2-4).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshsim {

// The deepest nesting a document may have. Scenarios and traces nest about ten levels; the bound
// is checked while scanning, before any document is built, so no reader recurses past it.
inline constexpr int kMaxJsonDepth = 100;

// Parses one JSON document strictly: InputError (exit 2) naming `file`, the JSON path and the line
// and column for a syntax error, a NUL byte, bytes after the document, nesting deeper than
// kMaxJsonDepth, or a key repeated within one object (JSON leaves which one counts open, so
// meshsim takes neither).
nlohmann::json parse_json_text(const std::string& text, const std::string& file);

// read_json_file: parse_json_text on a file's bytes; InputError with the reason (errno's words)
// when it cannot be read.
nlohmann::json read_json_file(const std::string& path);

// Writes `text` to `path` through a temporary file in the same directory and a rename, so the
// file is either the old one or the new one, whole. InputError naming the path and why (errno's
// words) when it cannot; the temporary file is removed then.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts);
inline void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, std::vector<std::string_view>{text});
}

// Refuses (InputError naming the option) an output path that names one of the inputs, as the
// same file under any spelling (`run s.json --trace ./s.json` would replace the scenario).
void refuse_output_over_input(const std::string& option, const std::string& out,
                              const std::vector<std::string>& inputs);

}  // namespace meshsim
