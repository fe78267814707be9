// Hostile input and failed writes (issue: no crash, no lost file): the strict JSON reader and the
// atomic writer every file of meshsim goes through (core/files.h).
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace meshsim {
namespace {

namespace fs = std::filesystem;

// The InputError `text` raises, as "path: detail" (the file is "f.json").
std::string refusal(const std::string& text) {
  try {
    parse_json_text(text, "f.json");
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "f.json");
    return e.json_path() + ": " + e.detail();
  }
  return "accepted";
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(StrictJson, DeepNestingIsRefusedBeforeAnythingIsBuilt) {
  // 100,000 levels: a recursive copy of such a document overflowed the stack (SIGSEGV).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string r = refusal(deep);
  EXPECT_NE(r.find("nesting deeper than 100 levels"), std::string::npos) << r.substr(0, 300);
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 5000; ++i) s += "{\"a\":";
    return s + "1" + std::string(5000, '}');
  }();
  EXPECT_TRUE(starts_with(refusal(objects), "/a/a/a/")) << refusal(objects).substr(0, 100);
  // The bound itself: 100 levels read, 101 refused.
  EXPECT_EQ(refusal(std::string(100, '[') + std::string(100, ']')), "accepted");
  EXPECT_NE(refusal(std::string(101, '[') + std::string(101, ']')), "accepted");
}

TEST(StrictJson, RepeatedKeysAreRefusedWithTheirPath) {
  EXPECT_TRUE(starts_with(refusal(R"({"mesh": 1, "mesh": 2})"), "/mesh: the key \"mesh\" appears twice"))
      << refusal(R"({"mesh": 1, "mesh": 2})");
  const std::string nested = R"({"program": [{"op": "add"}, {"op": "mul", "args": [], "op": "sub"}]})";
  EXPECT_TRUE(starts_with(refusal(nested), "/program/1/op: the key \"op\" appears twice")) << refusal(nested);
  // The same key in sibling objects is fine; escaped in the path as RFC 6901 says.
  EXPECT_EQ(refusal(R"([{"a": 1}, {"a": 2}])"), "accepted");
  EXPECT_TRUE(starts_with(refusal(R"({"x": {"a/b~": 1, "a/b~": 2}})"), "/x/a~1b~0: ")) << refusal(R"({"x": {"a/b~": 1, "a/b~": 2}})");
}

TEST(StrictJson, NulAndTrailingBytesAreRefused) {
  // nlohmann stops reading at a NUL, so what followed one was silently ignored.
  const std::string nul = std::string("{\"a\": 1}\n") + '\0' + "{\"b\": 2}";
  EXPECT_NE(refusal(nul).find("a NUL byte at line 2, column 1 (byte 9)"), std::string::npos) << refusal(nul);
  EXPECT_NE(refusal(std::string("{\"a\": \"x") + '\0' + "y\"}"), "accepted");
  const std::string trailing = refusal("{\"a\": 1} {}");
  EXPECT_NE(trailing.find("line 1, column 10"), std::string::npos) << trailing;
  EXPECT_NE(trailing.find("expected end of input"), std::string::npos) << trailing;
  EXPECT_NE(refusal("[1e999]"), "accepted");
  EXPECT_NE(refusal(""), "accepted");
}

TEST(StrictJson, SyntaxErrorsNameTheElementBeingRead) {
  EXPECT_TRUE(starts_with(refusal("{\"mesh\": {\"shape\": [2, }}"), "/mesh/shape/1: invalid JSON at line 1, column 24"))
      << refusal("{\"mesh\": {\"shape\": [2, }}");
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("meshsim_test_files_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string contents(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t entries(const fs::path& dir) {
  size_t n = 0;
  for (auto it = fs::directory_iterator(dir); it != fs::directory_iterator(); ++it) ++n;
  return n;
}

TEST(AtomicWrite, AWriteThatFailsPartwayLeavesTheOldFileWhole) {
  const fs::path dir = fresh_dir("partway");
  const fs::path target = dir / "trace.json";
  write_file_atomically(target.string(), "the good trace\n");
  // A file size limit of 4 KiB makes the write of 100 KB fail partway (EFBIG), as a full disk does.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      write_file_atomically(target.string(), std::string(100000, 'x'));
    } catch (const InputError& e) {
      const std::string what = e.what();
      ::_exit(what.find("cannot write: File too large; the file was left as it was") != std::string::npos ? 0 : 3);
    }
    ::_exit(4);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the message lacks the reason; 4: no error";
  EXPECT_EQ(contents(target), "the good trace\n");
  EXPECT_EQ(entries(dir), 1u) << "the temporary file is left behind";
  fs::remove_all(dir);
}

TEST(AtomicWrite, ReasonsAreSaidAndNothingIsLeftBehind) {
  const fs::path dir = fresh_dir("reasons");
  try {
    write_file_atomically((dir / "no" / "such" / "x.json").string(), "x");
    ADD_FAILURE() << "written";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write: No such file or directory"), std::string::npos) << e.what();
  }
  fs::create_directories(dir / "taken" / "inside");
  EXPECT_THROW(write_file_atomically((dir / "taken").string(), "x"), InputError);
  EXPECT_TRUE(fs::is_directory(dir / "taken" / "inside"));
  EXPECT_EQ(entries(dir), 1u);
  // A good write replaces the old file and has the usual permissions, not mkstemp's 0600.
  write_file_atomically((dir / "a.txt").string(), "old");
  write_file_atomically((dir / "a.txt").string(), std::vector<std::string_view>{"ne", "w"});
  EXPECT_EQ(contents(dir / "a.txt"), "new");
  EXPECT_NE(fs::status(dir / "a.txt").permissions() & fs::perms::others_read, fs::perms::none);
  fs::remove_all(dir);
}

TEST(AtomicWrite, AnOutputThatIsAnInputIsRefused) {
  const fs::path dir = fresh_dir("same");
  write_file_atomically((dir / "s.json").string(), "{}");
  const std::string spelled = (dir / "." / "s.json").string();
  try {
    refuse_output_over_input("--trace", spelled, {(dir / "s.json").string()});
    ADD_FAILURE() << "not refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("refused as --trace: it is the input"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(refuse_output_over_input("--trace", (dir / "t.json").string(), {(dir / "s.json").string()}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshsim
