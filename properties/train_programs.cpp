#include "properties/train_programs.h"

#include <set>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "oracles/check.h"
#include "properties/properties.h"

namespace meshsim::gen {

namespace {

using json = nlohmann::json;

// One placement per mesh axis among `choices` (strings), at most one axis sharding a tensor dim
// (the shards of one dim from two axes are covered by the other generators).
json draw_spec(size_t axes, const std::vector<std::string>& choices) {
  json spec = json::array();
  std::set<std::string> used;
  for (size_t a = 0; a < axes; ++a) {
    std::string p = *rc::gen::elementOf(choices);
    if (p != "R" && !used.insert(p).second) p = "R";
    spec.push_back(p);
  }
  return spec;
}

// The mesh axes a spec shards (by index).
std::set<size_t> sharded_axes(const json& spec, const std::vector<int64_t>& sizes) {
  std::set<size_t> out;
  for (size_t a = 0; a < spec.size(); ++a)
    if (spec[a].get<std::string>()[0] == 'S' && sizes[a] > 1) out.insert(a);
  return out;
}

}  // namespace

json train_program() {
  const size_t naxes = *rc::gen::inRange<size_t>(1, 3);
  std::vector<int64_t> sizes;
  json axes = json::array();
  for (size_t a = 0; a < naxes; ++a) {
    sizes.push_back(*rc::gen::inRange<int64_t>(1, 4));
    axes.push_back(std::string(1, static_cast<char>('a' + a)));
  }
  const int64_t m = *rc::gen::inRange<int64_t>(1, 8), k = *rc::gen::inRange<int64_t>(1, 6),
                h = *rc::gen::inRange<int64_t>(1, 6), n = *rc::gen::inRange<int64_t>(1, 5);
  const bool randn = *rc::gen::arbitrary<bool>();
  auto param = [&](const std::string& name, const json& shape, const std::vector<std::string>& choices) {
    json p = {{"name", name}, {"shape", shape}, {"placements", draw_spec(naxes, choices)}, {"requires_grad", true}};
    if (randn) p["init"] = "randn";
    return p;
  };
  json inputs = json::array({{{"name", "x"}, {"shape", {m, k}}, {"placements", draw_spec(naxes, {"S(0)", "S(1)", "R"})}},
                             param("w1", {k, h}, {"R", "S(0)", "S(1)"}), param("b", {h}, {"R", "S(0)"}),
                             param("w2", {h, n}, {"R", "S(0)", "S(1)"})});
  json program = json::array();
  program.push_back({{"out", "xs"}, {"op", "scale"}, {"args", {"x"}}, {"value", 0.125}});
  // A parameter used as it is, or gathered first (to Rd: FSDP's reduce_scatter in the backward; or R).
  auto use = [&](size_t input) {
    const json& p = inputs[input];
    const std::string name = p["name"];
    if (sharded_axes(p["placements"], sizes).empty() || *rc::gen::inRange(0, 3) == 0) return name;
    const std::string gathered = *rc::gen::element<std::string>("Rd", "R");
    json to = json::array();
    for (const auto& pl : p["placements"]) to.push_back(pl.get<std::string>()[0] == 'S' ? gathered : "R");
    program.push_back({{"out", name + "_full"}, {"op", "redistribute"}, {"args", {name}}, {"placements", to}});
    return name + "_full";
  };
  const std::string w1 = use(1), b = use(2), w2 = use(3);
  program.push_back({{"out", "xw"}, {"op", "mm"}, {"args", {"xs", w1}}});
  program.push_back({{"out", "hb"}, {"op", "add"}, {"args", {"xw", b}}});
  program.push_back({{"out", "a"}, {"op", "tanh"}, {"args", {"hb"}}});
  program.push_back({{"out", "y"}, {"op", "mm"}, {"args", {"a", w2}}});
  std::string last = "y";
  if (*rc::gen::arbitrary<bool>()) {
    program.push_back({{"out", "y2"}, {"op", "mul"}, {"args", {"y", "y"}}});
    last = "y2";
  }
  program.push_back({{"out", "loss"}, {"op", "sum"}, {"args", {last}}});

  const int64_t steps = *rc::gen::inRange<int64_t>(1, 4);
  json train = {{"steps", steps}, {"microbatches", *rc::gen::inRange<int64_t>(1, 4)}};
  if (*rc::gen::inRange(0, 4) == 0) train["data"] = "fixed";
  if (*rc::gen::inRange(0, 3) == 0) train["batch"] = {"x"};  // x cut from the step's batch
  if (*rc::gen::arbitrary<bool>()) {
    train["lr"] = json::array();
    for (int64_t s = 0; s < steps; ++s) train["lr"].push_back(*rc::gen::element(0.02, 0.01, 0.005));
  } else {
    train["lr"] = *rc::gen::element(0.05, 0.01);
  }
  json opt;
  if (*rc::gen::arbitrary<bool>()) {
    opt = {{"kind", "sgd"}};
    const double momentum = *rc::gen::element(0.0, 0.9);
    if (momentum > 0) {
      opt["momentum"] = momentum;
      const double dampening = *rc::gen::element(0.0, 0.1);
      if (dampening > 0) opt["dampening"] = dampening;
      else if (*rc::gen::arbitrary<bool>()) opt["nesterov"] = true;
    }
    if (*rc::gen::arbitrary<bool>()) opt["weight_decay"] = 0.01;
  } else {
    opt = {{"kind", "adamw"}};
    if (*rc::gen::arbitrary<bool>()) opt["weight_decay"] = 0.0;
  }
  // Optimizer states laid out otherwise now and then (ZeRO), where the optimizer has states.
  const bool has_states = opt["kind"] == "adamw" || opt.contains("momentum");
  for (size_t i = 1; has_states && i < inputs.size(); ++i)
    if (*rc::gen::inRange(0, 3) == 0) {
      const bool matrix = inputs[i]["shape"].size() == 2;
      opt["states"][inputs[i]["name"].get<std::string>()] =
          draw_spec(naxes, matrix ? std::vector<std::string>{"R", "S(0)", "S(1)"} : std::vector<std::string>{"R", "S(0)"});
    }
  train["optimizer"] = opt;
  if (*rc::gen::arbitrary<bool>()) {
    json clip = {{"max_norm", *rc::gen::element(0.5, 2.0, 1000.0)}};
    const json norm = *rc::gen::element<json>(2, 1, 3, "inf");
    if (norm != 2) clip["norm_type"] = norm;
    std::vector<size_t> clipped = {1, 2, 3};
    if (*rc::gen::inRange(0, 3) == 0) {
      clipped = {*rc::gen::inRange<size_t>(1, 4)};
      clip["params"] = {inputs[clipped[0]]["name"]};
    }
    // The user's reduction where one is right: every clipped gradient sharded over the same axes.
    std::set<std::set<size_t>> sets;
    for (size_t i : clipped) sets.insert(sharded_axes(inputs[i]["placements"], sizes));
    if (sets.size() == 1 && *rc::gen::arbitrary<bool>()) {
      json over = json::array();
      for (size_t a : *sets.begin()) over.push_back(axes[a]);
      clip["reduce"] = {{"all_reduce", over}};
    }
    train["clip_grad_norm"] = clip;
  }
  return {{"format", "meshsim.scenario/1"},
          {"name", "train_program"},
          {"mesh", {{"axes", axes}, {"shape", sizes}}},
          {"options", {{"seed", *rc::gen::inRange<uint64_t>(0, 1000)}}},
          {"inputs", inputs},
          {"program", program},
          {"backward", "loss"},
          {"train", train}};
}

}  // namespace meshsim::gen

namespace meshsim {

void train_equivalence() {
  const nlohmann::json doc = gen::train_program();
  CheckedRun run = run_generated(doc);
  if (run.result["status"] != "pass") {
    const std::string why = run.result.contains("failures") ? run.result["failures"].dump() : run.result["error"].dump();
    RC_FAIL(run.result["status"].get<std::string>() + ": " + why);
  }
}

}  // namespace meshsim
