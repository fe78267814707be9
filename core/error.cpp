#include "core/error.h"

#include <algorithm>

#include <new>

namespace meshsim {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidScenario: return "invalid_scenario";
    case ErrorKind::IllegalRedistribute: return "illegal_redistribute";
    case ErrorKind::NotDifferentiable: return "not_differentiable";
    case ErrorKind::ExclusivityViolation: return "exclusivity_violation";
    case ErrorKind::ReducedMismatch: return "reduced_mismatch";
    case ErrorKind::MeshMismatch: return "mesh_mismatch";
    case ErrorKind::ShapeMismatch: return "shape_mismatch";
    case ErrorKind::UnsupportedOp: return "unsupported_op";
    case ErrorKind::OutSpecMismatch: return "out_spec_mismatch";
    case ErrorKind::UnreducedMisuse: return "unreduced_misuse";
    case ErrorKind::ResourceLimit: return "resource_limit";
    case ErrorKind::OutOfMemory: return "out_of_memory";
  }
  return "invalid_scenario";
}

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidScenario:
    case ErrorKind::ShapeMismatch:
    case ErrorKind::UnsupportedOp:
    case ErrorKind::ResourceLimit:
      return 2;
    case ErrorKind::OutOfMemory:
      return kExitResource;
    default:
      return 3;
  }
}

std::string shown(const std::string& text, size_t limit) {
  std::string out;
  size_t n = std::min(text.size(), limit);
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xc0) == 0x80) --n;  // whole UTF-8 characters
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > limit) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

static std::string compose(const std::string& file, const std::string& path, const std::string& msg) {
  std::string out = file.empty() ? std::string("<input>") : file;
  out += ": ";
  if (!path.empty()) out += path + ": ";  // none: the message is about the file, not a place in it
  out += msg;
  return out;
}

InputError::InputError(const std::string& file, const std::string& json_path,
                       const std::string& message, ErrorKind kind)
    : std::runtime_error(compose(file, json_path, message)),
      file_(file),
      json_path_(json_path),
      detail_(message),
      kind_(kind) {}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e)) return true;
  // libtorch's CPU allocator: "DefaultCPUAllocator: not enough memory: you tried to allocate N bytes"
  // (older releases: "can't allocate memory").
  const std::string what = first_line(e.what());
  return what.find("not enough memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace meshsim
