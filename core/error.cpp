#include "core/error.h"

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
  }
  return "invalid_scenario";
}

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidScenario:
    case ErrorKind::ShapeMismatch:
    case ErrorKind::UnsupportedOp:
      return 2;
    default:
      return 3;
  }
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

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace meshsim
