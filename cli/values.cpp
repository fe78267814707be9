#include "cli/values.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/files.h"

// .npy files are written little-endian, as this host lays them out.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "write_values writes .npy data in host order, which must be little-endian"
#endif

namespace meshsim {

namespace {

namespace fs = std::filesystem;

struct NpyType {
  const char* descr;  // NumPy's array-protocol type string
  const char* name;   // numpy dtype name, for index.json
};

// The .npy type of an element type; others (none in a run today) are written as float64.
std::optional<NpyType> npy_type(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return NpyType{"<f8", "float64"};
    case at::kFloat: return NpyType{"<f4", "float32"};
    case at::kBool: return NpyType{"|b1", "bool"};
    case at::kLong: return NpyType{"<i8", "int64"};
    default: return std::nullopt;
  }
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir.string(), "", "cannot create the directory: " + ec.message());
}

// NPY format 1.0: magic, version, a little-endian uint16 header length, then a Python dict literal
// padded with spaces and ended by a newline so that the data start at a multiple of 64 bytes.
std::string npy_header(const char* descr, at::IntArrayRef shape) {
  std::string dims;
  for (auto d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  if (shape.size() == 1) dims += ',';  // a Python 1-tuple, as numpy writes it: (3,)
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t preamble = 10;  // magic (6), version (2), header length (2)
  const size_t padded = (preamble + dict.size() + 1 + 63) / 64 * 64;
  dict.append(padded - preamble - dict.size() - 1, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  return out + dict;
}

// Writes `t` as .npy at `path`; returns the numpy dtype name written.
std::string write_npy(const std::string& path, const at::Tensor& t) {
  at::Tensor c = t.detach().cpu();
  auto type = npy_type(c.scalar_type());
  if (!type) {
    c = c.to(at::kDouble);
    type = npy_type(at::kDouble);
  }
  c = c.contiguous();
  write_new_file(path, {npy_header(type->descr, c.sizes()),
                        {static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size())}});
  return type->name;
}

// A name as a file or folder name that stays in its folder (see values.h).
std::string file_name(const std::string& name) {
  if (name == "." || name == "..") return name == "." ? "%2E" : "%2E%2E";
  std::string out;
  for (unsigned char ch : name) {
    if (ch == '/' || ch == '\\' || ch == '%' || ch < 0x20 || ch == 0x7f) {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

nlohmann::json placements_json(const Spec& spec) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : spec) out.push_back(p.str());
  return out;
}

class Writer {
 public:
  explicit Writer(fs::path dir) : dir_(std::move(dir)) {}

  // One tensor at DIR/rel, listed in the index (an undefined one is listed as missing, with why).
  void put(const std::string& rel, const at::Tensor& t, const KeptTensor& k, const std::string& kind,
           const std::string& missing_why, nlohmann::json extra = nlohmann::json::object()) {
    if (!t.defined()) {
      nlohmann::json entry = {{"value", k.name}, {"kind", kind}, {"reason", missing_why}};
      entry.update(extra);
      missing_.push_back(entry);
      return;
    }
    const fs::path path = dir_ / rel;
    make_dirs(path.parent_path());
    nlohmann::json entry = {{"path", rel},
                            {"value", k.name},
                            {"kind", kind},
                            {"placements", placements_json(k.spec)},
                            {"shape", t.sizes().vec()}};
    entry["dtype"] = write_npy(path.string(), t);
    entry.update(extra);
    files_.push_back(entry);
  }

  void index(const CheckedRun& run) {
    make_dirs(dir_);
    nlohmann::json doc = {{"format", "meshsim.values/1"},
                          {"name", run.result.value("name", nlohmann::json())},
                          {"status", run.result.value("status", nlohmann::json())},
                          {"kept", run.tensors != nullptr},
                          {"files", files_},
                          {"missing", missing_}};
    const std::string text = doc.dump(2) + "\n";
    write_new_file((dir_ / "index.json").string(), {text});
  }

 private:
  fs::path dir_;
  nlohmann::json files_ = nlohmann::json::array(), missing_ = nlohmann::json::array();
};

// The files of write_values, in a fresh directory.
void write_values_into(const CheckedRun& run, const std::string& dir, bool per_rank) {
  Writer w{fs::path(dir)};
  if (run.tensors) {
    const std::string no_assembly = "its locals do not form a tensor";
    for (const auto& k : run.tensors->values) {
      const std::string f = file_name(k.name);
      w.put("values/" + f + ".npy", k.global, k, "value", no_assembly);
      w.put("oracle/" + f + ".npy", k.oracle, k, "oracle", "the oracle has no value of it");
      if (!per_rank) continue;
      // A value named grad_x would share the folder of x's gradient: its 'g' is spelled %67.
      const std::string folder = f.compare(0, 5, "grad_") == 0 ? "%67" + f.substr(1) : f;
      for (size_t r = 0; r < k.locals.size(); ++r)
        w.put("ranks/" + folder + "/rank" + std::to_string(r) + ".npy", k.locals[r], k, "rank", "no local",
              {{"rank", r}});
    }
    for (const auto& k : run.tensors->grads) {
      const std::string f = file_name(k.name);
      w.put("grads/" + f + ".npy", k.global, k, "grad",
            k.locals.empty() ? "no gradient reaches it on the mesh" : no_assembly);
      w.put("oracle_grads/" + f + ".npy", k.oracle, k, "oracle_grad", "the oracle has no gradient of it");
      if (!per_rank) continue;
      for (size_t r = 0; r < k.locals.size(); ++r)
        w.put("ranks/grad_" + f + "/rank" + std::to_string(r) + ".npy", k.locals[r], k, "grad_rank", "no local",
              {{"rank", r}, {"divisor", k.divisor}});
    }
    // Training steps: each microbatch's data, then every parameter and optimizer state after each step.
    for (const auto& t : run.tensors->train) {
      const std::string f = file_name(t.tensor.name);
      const std::string step = "train/step" + std::to_string(t.step) + "/";
      nlohmann::json at_step = {{"step", t.step}};
      if (t.kind == "input") {
        const std::string mb = step + "mb" + std::to_string(t.microbatch) + "/";
        at_step["microbatch"] = t.microbatch;
        w.put(mb + "values/" + f + ".npy", t.tensor.global, t.tensor, "train_input", no_assembly, at_step);
        if (!per_rank) continue;
        for (size_t r = 0; r < t.tensor.locals.size(); ++r) {
          nlohmann::json extra = at_step;
          extra["rank"] = r;
          w.put(mb + "ranks/" + f + "/rank" + std::to_string(r) + ".npy", t.tensor.locals[r], t.tensor,
                "train_input_rank", "no local", extra);
        }
        continue;
      }
      const bool state = t.kind == "state";
      if (state) at_step["state"] = t.state;
      const std::string rel = state ? "states/" + f + "/" + file_name(t.state) : "params/" + f;
      w.put(step + rel + ".npy", t.tensor.global, t.tensor, state ? "train_state" : "train_param", no_assembly, at_step);
      w.put(step + "oracle_" + rel + ".npy", t.tensor.oracle, t.tensor, state ? "train_oracle_state" : "train_oracle_param",
            "the oracle has no value of it", at_step);
    }
  }
  w.index(run);
}

}  // namespace

void write_values(const CheckedRun& run, const std::string& dir, bool per_rank) {
  write_directory_atomically(dir, [&](const std::string& staging) { write_values_into(run, staging, per_rank); });
}

}  // namespace meshsim
