// Error kinds of the result contract (DESIGN.md, contract 3) and the exit codes of contract 1.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace meshsim {

enum class ErrorKind {
  InvalidScenario,
  IllegalRedistribute,
  NotDifferentiable,
  ExclusivityViolation,
  ReducedMismatch,
  MeshMismatch,
  ShapeMismatch,
  UnsupportedOp,
  OutSpecMismatch,  // a local_map returns a value whose variance contradicts its out placement
  UnreducedMisuse,  // partial_in_local_map unreduced: an op a Partial's locals cannot take unreduced
  ResourceLimit,    // the scenario needs more memory or ranks than the limits allow (refused up front)
  OutOfMemory,      // memory ran out during the run (exit kExitResource)
};

// Exit code of a run that ran out of memory (contract 1, extended): neither a failed check (1) nor
// unusable input (2); 4 and 5 are validate's.
inline constexpr int kExitResource = 6;

// Whether `e` says memory ran out: std::bad_alloc, a container asked for more than it can hold,
// or libtorch's allocator refusing.
bool is_out_of_memory(const std::exception& e);

// The first line of a message (libtorch's carry a backtrace after it).
std::string first_line(const std::string& text);

// A string of the user's (a key, a name, an option) as a message shows it: control characters
// escaped (\n, \t, \x1b, \x00: nothing reaches the terminal or Graphviz as a control), and past
// `limit` bytes cut, with the length in all ("aaaa... (104857600 bytes)").
std::string shown(const std::string& text, size_t limit = 120);

// The spelling used in result JSON: "illegal_redistribute", ...
const char* error_kind_name(ErrorKind kind);

// Exit code of contract 1: 2 for unusable input, 3 for a scenario illegal under the semantics.
int exit_code_for(ErrorKind kind);

// A scenario that is illegal under the semantics (exit 3), or unusable (exit 2), raised while running.
class SemanticError : public std::runtime_error {
 public:
  SemanticError(ErrorKind kind, const std::string& message, std::string path = "")
      : std::runtime_error(message), kind_(kind), path_(std::move(path)) {}
  ErrorKind kind() const { return kind_; }
  // The JSON path of the scenario element it was raised at ("/program/3"), "" when unknown.
  const std::string& path() const { return path_; }
  void set_path(const std::string& path) { path_ = path; }

 private:
  ErrorKind kind_;
  std::string path_;
};

// Unusable input found while reading a file: names the file and the JSON path (exit 2).
class InputError : public std::runtime_error {
 public:
  InputError(const std::string& file, const std::string& json_path, const std::string& message,
             ErrorKind kind = ErrorKind::InvalidScenario);
  const std::string& file() const { return file_; }
  const std::string& json_path() const { return json_path_; }
  const std::string& detail() const { return detail_; }
  ErrorKind kind() const { return kind_; }

 private:
  std::string file_, json_path_, detail_;
  ErrorKind kind_;
};

}  // namespace meshsim
