#include "core/resources.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "core/propagation.h"

namespace meshsim {

namespace {

// What one value holds: its global element count and how many times over the mesh holds it (the
// product of the sizes of the axes it is not sharded over: 1 for fully sharded, ranks for R).
struct Held {
  double numel = 0;
  double copies = 1;
  double element_bytes = 8;
  Shape shape;  // as inferred; empty where it is not known
};

double numel_of(const Shape& shape) {
  double n = 1;
  for (auto d : shape) n *= static_cast<double>(std::max<int64_t>(d, 0));
  return n;
}

double copies_of(const Mesh& mesh, const Spec& spec) {
  double c = 1;
  for (size_t a = 0; a < spec.size() && a < static_cast<size_t>(mesh.ndim()); ++a)
    if (!spec[a].is_shard()) c *= static_cast<double>(mesh.axis_size(static_cast<int>(a)));
  return c;
}

// A placements attribute (redistribute's, a creation op's); what is not a placement is skipped.
Spec spec_attr(const nlohmann::json& placements) {
  Spec out;
  if (placements.is_array())
    for (const auto& p : placements)
      if (p.is_string()) try {
          out.push_back(parse_placement(p.get<std::string>()));
        } catch (const std::exception&) {
        }
  return out;
}

double element_bytes(ElementType type, double float_bytes) {
  return type == ElementType::Float ? float_bytes : type == ElementType::Bool ? 1 : 8;
}

// Per value and rank, beyond the data: a libtorch tensor and its storage, the DTensor's entry,
// the trace's hash; measured on examples/scale/fsdp_4096.json (docs/performance.md).
constexpr double kBytesPerLocal = 1024;

// One walk over a list of ops (the program, a local_map's body or its reference) with the values
// it sees: its own and, for a body or reference, those its local_map sees (`outer`). A program's
// values are the mesh's and the oracle's; a body's are the mesh's alone (every rank's locals); a
// reference's the oracle's alone (global tensors, on no rank).
struct Walk {
  const Scenario& sc;
  double float_bytes;
  ResourceEstimate& e;
  size_t& locals;
  const Walk* outer = nullptr;
  bool on_mesh = true, in_oracle = true;
  std::map<std::string, Held> held;

  const Held* find(const std::string& name) const {
    auto it = held.find(name);
    return it != held.end() ? &it->second : outer ? outer->find(name) : nullptr;
  }

  void add(const std::string& name, const std::string& path, const Held& h) {
    held[name] = h;
    if (in_oracle) e.oracle_bytes += h.numel * h.element_bytes;
    if (!on_mesh) return;
    const double over_mesh = h.numel * h.copies * h.element_bytes;
    e.mesh_bytes += over_mesh;
    ++locals;
    if (over_mesh > e.largest_bytes) e.largest = name, e.largest_path = path, e.largest_bytes = over_mesh;
  }

  void run(const std::vector<OpDecl>& ops) {
    for (const auto& op : ops) {
      if (is_creation_op(op.op)) {
        created(op);
        continue;
      }
      // The largest argument stands for the result's size; the result is sharded where its
      // arguments are (an op of a sharded and a replicated value is sharded): the fewest copies.
      Held out{0, 1, float_bytes, {}};
      double copies = -1;
      std::vector<Shape> in_shapes;
      for (const auto& a : op.args) {
        const Held* h = find(a);
        if (!h) continue;
        in_shapes.push_back(h->shape);
        copies = copies < 0 ? h->copies : std::min(copies, h->copies);
        if (h->numel > out.numel) out = *h;
      }
      out.copies = copies < 0 ? 1 : copies;
      if (op.op == "local_map") {
        local_map(op, out);
        continue;
      }
      if (op.op == "redistribute" && op.attrs.contains("placements")) {
        out.copies = copies_of(sc.mesh, spec_attr(op.attrs["placements"]));
      } else if (op.outs.size() <= 1 && in_shapes.size() == op.args.size()) {
        // The shape the rules infer, where they can (mm of [n,1] by [1,n] is n*n, not n).
        try {
          out.shape = infer_shape(op.op, in_shapes, op_attrs(op));
          out.numel = numel_of(out.shape);
        } catch (const std::exception&) {
          // Not inferable here (local code, a collective): the largest argument stands for it.
        }
      }
      for (const auto& name : op.outs.empty() ? std::vector<std::string>{op.out} : op.outs) add(name, op.path, out);
    }
  }

  // ones, zeros, full, arange: a value of the attributes' shape, dtype and placements.
  void created(const OpDecl& op) {
    Held h{0, 1, float_bytes, {}};
    try {
      h.shape = op.attrs.at("shape").get<Shape>();
      h.element_bytes = element_bytes(parse_element_type(op.attrs.value("dtype", "float")), float_bytes);
    } catch (const std::exception&) {
      // Not a creation op the reader accepts: what it could read stands.
    }
    h.numel = numel_of(h.shape);
    if (op.attrs.contains("placements")) h.copies = copies_of(sc.mesh, spec_attr(op.attrs["placements"]));
    else h.copies = static_cast<double>(sc.mesh.size());  // a body's: the same local on every rank
    add(op.out, op.path, h);
  }

  // A local_map: its body's values on every rank, its reference's in the oracle; each result as
  // large as the body value it returns (or, where that is unknown, as its largest argument).
  void local_map(const OpDecl& op, const Held& largest) {
    Walk body{sc, float_bytes, e, locals, this, on_mesh, false, {}};
    body.run(op.body);
    Walk reference{sc, float_bytes, e, locals, this, false, in_oracle, {}};
    reference.run(op.reference);
    const auto& outs = op.outs.empty() ? std::vector<std::string>{op.out} : op.outs;
    for (size_t i = 0; i < outs.size(); ++i) {
      const Held* returned = i < op.returns.size() ? body.find(op.returns[i]) : nullptr;
      Held out = returned ? *returned : largest;
      if (i < op.out_placements.size()) out.copies = copies_of(sc.mesh, op.out_placements[i]);
      add(outs[i], op.path, out);
    }
  }
};

}  // namespace

double default_max_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 8.0 * (1ull << 30);
  return static_cast<double>(pages) * static_cast<double>(page) / 2;
}

ResourceEstimate estimate_resources(const Scenario& sc, const RunOptions& options) {
  const double float_bytes = options.dtype == DType::Float32 ? 4 : 8;
  const double ranks = static_cast<double>(sc.mesh.size());
  ResourceEstimate e;
  size_t locals = 0;
  Walk walk{sc, float_bytes, e, locals, nullptr, true, true, {}};
  bool grads = false;
  for (const auto& in : sc.inputs) {
    // A from_local input gives each rank's local shape: every rank holds that much.
    Held h{numel_of(in.shape), in.from_local ? ranks : copies_of(sc.mesh, in.placements),
           element_bytes(in.dtype, float_bytes), in.shape};
    walk.add(in.name, in.path, h);
    grads |= in.requires_grad;
  }
  walk.run(sc.program);
  // Backward: a gradient for every value on the path, and the tensors autograd saves, each about
  // as large as the value; the oracle's backward likewise.
  if (!sc.backward.empty() && grads) e.autograd_bytes = 2 * (e.mesh_bytes + e.oracle_bytes);
  e.overhead_bytes = static_cast<double>(locals) * ranks * kBytesPerLocal * (sc.backward.empty() ? 1 : 2);
  return e;
}

void check_resources(const Scenario& sc, const RunOptions& options, const ResourceLimits& limits) {
  const int64_t ranks = sc.mesh.size();
  if (ranks > limits.max_ranks)
    throw SemanticError(ErrorKind::ResourceLimit,
                        "the mesh has " + std::to_string(ranks) + " ranks, more than the limit of " +
                            std::to_string(limits.max_ranks) +
                            " (every rank is simulated in this process, each op in time proportional to the "
                            "ranks); raise it with --max-ranks",
                        "/mesh/shape");
  const ResourceEstimate e = estimate_resources(sc, options);
  const double limit = limits.max_bytes > 0 ? limits.max_bytes : default_max_memory();
  const double need = e.total() * std::max(1, limits.processes);
  if (need <= limit) return;
  std::string what = "the run needs about " + format_bytes(need);
  if (limits.processes > 1) what += " (" + format_bytes(e.total()) + " in each of " + std::to_string(limits.processes) + " processes)";
  what += ", more than the limit of " + format_bytes(limit) + (limits.max_bytes > 0 ? "" : " (half this machine's memory)") +
          ": the mesh's locals " + format_bytes(e.mesh_bytes) + ", the oracle " + format_bytes(e.oracle_bytes) +
          ", autograd " + format_bytes(e.autograd_bytes) + ", per-rank overhead " + format_bytes(e.overhead_bytes) +
          "; the largest value is \"" + e.largest + "\" (" + format_bytes(e.largest_bytes) +
          " over the mesh); raise the limit with --max-memory";
  throw SemanticError(ErrorKind::ResourceLimit, what, e.largest_path);
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  std::ostringstream s;
  if (!std::isfinite(bytes)) return "more than can be counted";
  s.precision(bytes < 10 && u > 0 ? 2 : 3);
  s << bytes << " " << units[u];
  return s.str();
}

double parse_byte_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  static const std::string kUnits = "KMGT";
  double scale = 1;
  if (unit.size() == 1 && kUnits.find(static_cast<char>(std::toupper(unit[0]))) != std::string::npos)
    scale = std::pow(1024.0, 1 + static_cast<double>(kUnits.find(static_cast<char>(std::toupper(unit[0])))));
  else if (!unit.empty())
    used = 0;
  if (used == 0 || !std::isfinite(value) || value <= 0)
    throw std::invalid_argument("expected a size such as 8G, 512M or 1000000 (bytes), got \"" + text + "\"");
  return value * scale;
}

}  // namespace meshsim
