// A GoogleTest fixture whose tests run the meshsim binary (MESHSIM_BIN) in a fresh directory of
// their own, removed after the test; each call's output goes through files named after its number.
#pragma once

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tests/process_support.h"

namespace meshsim::testing {

class ProcessTest : public ::testing::Test {
 protected:
  // `prefix` names the tests' directories; `limit_s` is a call's default time limit.
  ProcessTest(std::string prefix, int limit_s) : prefix_(std::move(prefix)), limit_s_(limit_s) {}
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fresh_dir(prefix_, info->name());
  }
  void TearDown() override { remove_fresh_dir(dir); }

  Outcome meshsim(const std::string& args, int limit_s = 0) {
    return run_process(dir, MESHSIM_BIN, args, limit_s > 0 ? limit_s : limit_s_, std::to_string(++calls));
  }

  std::filesystem::path dir;
  int calls = 0;

 private:
  std::string prefix_;
  int limit_s_;
};

}  // namespace meshsim::testing
