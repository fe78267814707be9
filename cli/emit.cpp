#include "cli/emit.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/files.h"
#include "properties/programs.h"
#include "properties/train_programs.h"

namespace meshsim::cli {

namespace {

struct Generator {
  const char* name;
  nlohmann::json (*draw)();
};

// Each draws one program of a property generator (properties/programs.h). A local-code program
// carries the generator's verdict as its expect block, so that `meshsim run DIR` checks it too.
const std::vector<Generator>& generators() {
  static const std::vector<Generator> all = {
      {"dtensor", [] { return gen::dtensor_program(); }},
      {"dtensor_even", [] {
         gen::ProgramOptions o;
         o.even = true;
         return gen::dtensor_program(o);
       }},
      {"single_op", [] { return gen::single_op_program(); }},
      {"local_map", [] { return gen::local_map_program(); }},
      {"local_code", [] {
         gen::LocalCodeCase c = gen::local_code_program();
         c.doc["expect"] = {{"status", c.correct ? "pass" : "fail"}};
         return c.doc;
       }},
  };
  return all;
}

// Generators only --generators names (not in the default rotation, whose files a seed fixes).
const std::vector<Generator>& extra_generators() {
  static const std::vector<Generator> all = {
      {"local_map_even", [] {
         gen::ProgramOptions o;
         o.even = true;
         return gen::local_map_program(o);
       }},
      {"train", [] { return gen::train_program(); }},  // training steps (train_equivalence's programs)
  };
  return all;
}

// splitmix64: case i's stream, independent of the others.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

int cmd_emit(const EmitArgs& args, std::ostream& out) {
  namespace fs = std::filesystem;
  std::vector<Generator> gens;
  std::vector<Generator> known = generators();
  known.insert(known.end(), extra_generators().begin(), extra_generators().end());
  for (const auto& name : args.generators) {
    auto it = std::find_if(known.begin(), known.end(), [&](const Generator& g) { return name == g.name; });
    if (it == known.end()) {
      std::string names;
      for (const auto& g : known) names += std::string(names.empty() ? "" : ", ") + g.name;
      throw UsageError("--generators: no generator " + name + " (known: " + names + ")");
    }
    gens.push_back(*it);
  }
  if (gens.empty()) gens = generators();
  std::error_code ec;
  fs::create_directories(args.dir, ec);
  if (ec || !fs::is_directory(args.dir)) throw UsageError("--emit: cannot create the directory " + args.dir + ": " + ec.message());
  nlohmann::json names = nlohmann::json::array();
  for (const auto& g : gens) names.push_back(g.name);
  nlohmann::json manifest = {{"format", "meshsim.emit/1"}, {"seed", args.seed}, {"generators", names},
                             {"cases", nlohmann::json::array()}};
  const int width = std::max<int>(4, static_cast<int>(std::to_string(args.cases).size()));
  for (int i = 0; i < args.cases; ++i) {
    const Generator& g = gens[static_cast<size_t>(i) % gens.size()];
    // Sizes sweep 10..100 over each generator's cases (RapidCheck's size: below 10 most programs
    // are one op on one rank, which a differential run learns little from).
    const int size = 10 + static_cast<int>((static_cast<size_t>(i) / gens.size() * 37) % 91);
    uint64_t key = mix(args.seed ^ mix(static_cast<uint64_t>(i)));
    nlohmann::json doc;
    // A draw may be discarded by a generator's precondition: the next key of the case's stream.
    for (int attempt = 0;; ++attempt, key = mix(key)) {
      if (attempt == 1000) throw std::runtime_error("--emit: generator " + std::string(g.name) + " discarded 1000 draws");
      try {
        doc = rc::gen::exec(g.draw)(rc::Random(key), size).value();
        break;
      } catch (const rc::GenerationFailure&) {
      } catch (const rc::detail::CaseResult&) {
      }
    }
    std::ostringstream name;
    name << std::setw(width) << std::setfill('0') << i << "-" << g.name;
    doc["name"] = name.str();
    const std::string file = name.str() + ".json";
    write_file_atomically((fs::path(args.dir) / file).string(), doc.dump(1) + "\n");
    manifest["cases"].push_back({{"file", file}, {"generator", g.name}, {"size", size}, {"key", key}});
  }
  write_file_atomically((fs::path(args.dir) / "emitted.json").string(), manifest.dump(1) + "\n");
  std::string only;
  for (const auto& g : args.generators) only += (only.empty() ? " --generators " : ",") + g;
  out << "wrote " << args.cases << " scenarios to " << args.dir << " (seed " << args.seed << ": meshsim check --emit "
      << args.dir << " --cases " << args.cases << " --seed " << args.seed << only << ")\n";
  return 0;
}

}  // namespace meshsim::cli
