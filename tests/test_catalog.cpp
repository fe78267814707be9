// The op catalog (core/ops.h) and the layers keyed by it: every op with a kernel has a row in sim's
// kernel table (sim/kernels.cpp) and in the properties' definition table (properties/
// definitions.cpp), no row names another op, and an op without a kernel is refused as before.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/ops.h"
#include "properties/kernels.h"
#include "sim/local_ops.h"

namespace meshsim {
namespace {

// The tables check themselves against the catalog at their first use and throw std::logic_error
// naming the op when a row is missing or names an op without a kernel: EXPECT_NO_THROW prints it.
TEST(Catalog, EveryOpHasAKernel) {
  EXPECT_NO_THROW(has_kernel(0));
  for (const OpSchema& s : op_catalog()) EXPECT_EQ(has_kernel(s.id), s.kernel) << s.name;
}

TEST(Catalog, EveryOpHasADefinition) {
  EXPECT_NO_THROW(has_definition(0));
  for (const OpSchema& s : op_catalog()) EXPECT_EQ(has_definition(s.id), s.kernel) << s.name;
}

// The tables' check itself: a row of an op not in the catalog or without a kernel, two rows of an
// op, and an op with a kernel but no row are each a std::logic_error naming the op.
TEST(Catalog, TableCheckNamesTheOp) {
  std::vector<const char*> every;
  for (const OpSchema& s : op_catalog())
    if (s.kernel) every.push_back(s.name);
  EXPECT_EQ(rows_by_op_id(every, "rows.cpp", "kernel").at(op_id(every[0])), 0);
  auto message = [](std::vector<const char*> names) {
    try {
      rows_by_op_id(names, "rows.cpp", "kernel");
    } catch (const std::logic_error& e) {
      return std::string(e.what());
    }
    return std::string("nothing thrown");
  };
  auto with = [&](const char* extra) {
    auto names = every;
    names.push_back(extra);
    return names;
  };
  EXPECT_EQ(message(with("no_such_op")), "rows.cpp has a kernel row for \"no_such_op\", which is not in the op catalog");
  EXPECT_NE(message(with("redistribute")).find("\"redistribute\", which the op catalog"), std::string::npos);
  EXPECT_EQ(message(with(every[0])), "rows.cpp has two kernel rows for \"" + std::string(every[0]) + "\"");
  const std::string last = every.back();
  every.pop_back();
  EXPECT_EQ(message(every), "op \"" + last + "\" of the op catalog has no kernel row in rows.cpp");
}

// By name and by id alike: an op the runtime handles itself, or no op at all, is
// SemanticError(UnsupportedOp), as the chain of names gave it.
TEST(Catalog, OpWithoutAKernelIsUnsupported) {
  const at::Tensor x = at::ones({2}, at::kDouble);
  auto kind_of = [](const std::function<void()>& run) {
    try {
      run();
    } catch (const SemanticError& e) {
      return e.kind();
    }
    return ErrorKind::InvalidScenario;  // nothing thrown
  };
  EXPECT_EQ(kind_of([&] { local_op("no_such_op", OpAttrs{}, {x}); }), ErrorKind::UnsupportedOp);
  EXPECT_EQ(kind_of([&] { local_op("redistribute", OpAttrs{}, {x}); }), ErrorKind::UnsupportedOp);
  EXPECT_EQ(kind_of([&] { local_op(op_id("redistribute"), OpAttrs{}, {x}); }), ErrorKind::UnsupportedOp);
  EXPECT_TRUE(at::equal(local_op(op_id("neg"), OpAttrs{}, {x}), local_op("neg", OpAttrs{}, {x})));
}

}  // namespace
}  // namespace meshsim
