// Hostile input and failed writes (issue: no crash, no lost file): the strict JSON reader and the
// atomic writer every file of meshsim goes through (core/files.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
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

// Numbered too: the writer sweeps a directory once a process, so a repeated test needs a new one.
fs::path fresh_dir(const std::string& name) {
  static int made = 0;
  const fs::path dir = fs::temp_directory_path() /
                       ("meshsim_test_files_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(++made));
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


// --- Outputs that are not plain files (issue #37, item 2) -----------------------------------------

// Runs `body` in a child process; its wait status.
int in_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

struct stat lstat_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st;
}

TEST(OutputKinds, AFifoAndACharacterDeviceAreWrittenAsStreamsNotReplaced) {
  const fs::path dir = fresh_dir("streams");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // a reader, so the write need not wait
  ASSERT_GE(reader, 0);
  write_file_atomically(fifo.string(), std::vector<std::string_view>{"through ", "the pipe"});
  char buf[64] = {};
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(0, ::read(reader, buf, sizeof buf)))), "through the pipe");
  ::close(reader);
  EXPECT_TRUE(S_ISFIFO(lstat_of(fifo).st_mode)) << "the FIFO was replaced by a file";
  if (::geteuid() == 0) {
    // A device node of /dev/null's numbers: as root, the old writer made it a regular file.
    const fs::path null = dir / "null";
    ASSERT_EQ(::mknod(null.c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0);
    write_file_atomically(null.string(), std::string(10000, 'x'));
    EXPECT_TRUE(S_ISCHR(lstat_of(null).st_mode)) << "the device node was replaced by a file";
    const fs::path disk = dir / "blk";  // a block device is refused, never replaced nor written
    ASSERT_EQ(::mknod(disk.c_str(), S_IFBLK | 0600, ::makedev(7, 250)), 0);
    try {
      write_file_atomically(disk.string(), "x");
      ADD_FAILURE() << "written";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("it is a block device"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(S_ISBLK(lstat_of(disk).st_mode));
  }
  EXPECT_EQ(entries(dir), ::geteuid() == 0 ? 3u : 1u) << "a temporary file is left behind";
  fs::remove_all(dir);
}

TEST(OutputKinds, TheStandardStreamsByNameAreTheOpenDescriptors) {
  const fs::path dir = fresh_dir("stdout");
  const fs::path out = dir / "out.txt";
  for (const std::string name : {"/proc/self/fd/1", "/dev/fd/1"}) {
    SCOPED_TRACE(name);
    // As `meshsim run s.json --trace /proc/self/fd/1 > out.txt`: the trace follows what was printed,
    // in the file the shell opened, which stays the same file.
    const int status = in_child([&] {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      std::printf("printed before; ");
      try {
        write_file_atomically(name, "the trace\n");
      } catch (const InputError& e) {
        std::fprintf(stderr, "%s\n", e.what());
        ::_exit(3);
      }
      std::fflush(stdout);
    });
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_EQ(contents(out), "printed before; the trace\n");
  }
  fs::remove_all(dir);
}

TEST(OutputKinds, ALinkIsFollowedAndTheFileItNamesReplacedInItsDirectory) {
  const fs::path dir = fresh_dir("links");
  fs::create_directories(dir / "real");
  write_file_atomically((dir / "real" / "t.json").string(), "old");
  fs::create_symlink("real/t.json", dir / "link");
  fs::create_symlink(dir / "link", dir / "link2");  // a chain, absolute
  write_file_atomically((dir / "link2").string(), "new");
  EXPECT_TRUE(fs::is_symlink(dir / "link")) << "the link was replaced by a file";
  EXPECT_TRUE(fs::is_symlink(dir / "link2"));
  EXPECT_EQ(contents(dir / "real" / "t.json"), "new");
  fs::create_symlink("real/made.json", dir / "dangling");  // a link to no file yet: the file is made
  write_file_atomically((dir / "dangling").string(), "made");
  EXPECT_TRUE(fs::is_symlink(dir / "dangling"));
  EXPECT_EQ(contents(dir / "real" / "made.json"), "made");
  EXPECT_EQ(entries(dir), 4u);
  EXPECT_EQ(entries(dir / "real"), 2u);
  fs::create_symlink("loop", dir / "loop");
  EXPECT_THROW(write_file_atomically((dir / "loop").string(), "x"), InputError);
  fs::remove_all(dir);
}

TEST(OutputKinds, AReplacedFileKeepsItsModeAndOwner) {
  const fs::path dir = fresh_dir("mode");
  const fs::path f = dir / "private.json";
  write_file_atomically(f.string(), "old");
  ASSERT_EQ(::chmod(f.c_str(), 0600), 0);
  const bool root = ::geteuid() == 0;
  if (root) {
    ASSERT_EQ(::chown(f.c_str(), 12345, 23456), 0);
  }
  write_file_atomically(f.string(), "new");
  const struct stat st = lstat_of(f);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "a private file became readable by others";
  if (root) {
    EXPECT_EQ(st.st_uid, 12345u) << "another user's file became root's";
    EXPECT_EQ(st.st_gid, 23456u);
  }
  EXPECT_EQ(contents(f), "new");
  fs::remove_all(dir);
}

// --- A directory replaced whole (item 5) ----------------------------------------------------------

// The files of a directory, with their contents.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = contents(e.path());
  return out;
}

// A directory of `n` files that all say `tag`.
void fill_with(const std::string& staging, const std::string& tag, int n) {
  fs::create_directories(fs::path(staging) / "sub");
  for (int i = 0; i < n; ++i)
    write_new_file((fs::path(staging) / (i % 2 ? "sub" : "") / ("f" + std::to_string(i))).string(), {tag});
}

bool whole(const std::map<std::string, std::string>& files, int n) {
  std::set<std::string> tags;
  for (const auto& [name, text] : files) tags.insert(text);
  return files.size() == static_cast<size_t>(n) && tags.size() == 1;
}

TEST(DirectoryWrite, ReplacesTheDirectoryWholeAndKeepsTheOldOneOnFailure) {
  const fs::path dir = fresh_dir("dirs");
  const fs::path out = dir / "values";
  write_directory_atomically(out.string(), [](const std::string& s) { fill_with(s, "first", 6); });
  ASSERT_EQ(::chmod(out.c_str(), 0750), 0);
  write_new_file((out / "stale.npy").string(), {"of an older run"});
  write_directory_atomically(out.string(), [](const std::string& s) { fill_with(s, "second", 4); });
  EXPECT_EQ(tree(out).size(), 4u) << "files of the older run are left in it";
  EXPECT_TRUE(whole(tree(out), 4));
  EXPECT_EQ(fs::status(out).permissions(), static_cast<fs::perms>(0750));
  // A fill that fails partway leaves the old directory as it was, and nothing beside it.
  EXPECT_THROW(write_directory_atomically(out.string(), [](const std::string& s) {
    fill_with(s, "third", 2);
    throw InputError(s, "", "cannot write: No space left on device");
  }), InputError);
  EXPECT_EQ(tree(out), (std::map<std::string, std::string>{{"f0", "second"}, {"f2", "second"}, {"sub/f1", "second"}, {"sub/f3", "second"}}));
  EXPECT_EQ(entries(dir), 1u);
  fs::remove_all(dir);
}

TEST(DirectoryWrite, KilledAndConcurrentWritersLeaveOneRunsDirectory) {
  const fs::path dir = fresh_dir("dir_kills");
  const fs::path out = dir / "values";
  constexpr int kFiles = 40;
  // Each writer's directory: kFiles files that say its tag, one of them named after it (so that a
  // directory mixing runs has more than kFiles files).
  auto write = [&](const std::string& tag) {
    write_directory_atomically(out.string(), [&](const std::string& s) {
      fill_with(s, tag, kFiles - 1);
      write_new_file((fs::path(s) / tag).string(), {tag});
    });
  };
  std::vector<pid_t> pids;
  for (int w = 0; w < 4; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (int round = 0; w == 0 || round < 10; ++round) write("writer" + std::to_string(w));  // 0: until killed
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (size_t w = 1; w < pids.size(); ++w) ::waitpid(pids[w], nullptr, 0);
  ::kill(pids[0], SIGKILL);  // in the middle of a write, as kill -9
  ::waitpid(pids[0], nullptr, 0);
  EXPECT_TRUE(whole(tree(out), kFiles)) << "a directory mixing runs: " << tree(out).size() << " files";
  // What the killed writer left beside it (its temporary directory) goes with the next write.
  write("last");
  EXPECT_TRUE(whole(tree(out), kFiles));
  EXPECT_EQ(entries(dir), 1u) << "a killed writer's temporary directory is left";
  fs::remove_all(dir);
}

TEST(DirectoryWrite, ADirectoryHoldingAnInputIsRefused) {
  const fs::path dir = fresh_dir("dir_input");
  fs::create_directories(dir / "out" / "deep");
  write_new_file((dir / "out" / "deep" / "s.json").string(), {"{}"});
  for (const fs::path& d : {dir / "out", dir / "out" / ".", dir / "out" / "deep" / ".."}) {
    try {
      refuse_directory_over_input("--values", d.string(), {(dir / "out" / "deep" / "s.json").string()});
      ADD_FAILURE() << d << " not refused";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("refused as --values: it holds the input"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(refuse_directory_over_input("--values", (dir / "outside").string(), {(dir / "out" / "deep" / "s.json").string()}));
  EXPECT_NO_THROW(refuse_directory_over_input("--values", (dir / "ou").string(), {(dir / "out" / "deep" / "s.json").string()}));
  fs::remove_all(dir);
}

// --- Inputs: the size limit (item 4) --------------------------------------------------------------

// Restores the limit when a test ends.
struct InputLimit {
  explicit InputLimit(uint64_t bytes) { set_max_input_bytes(bytes); }
  ~InputLimit() { set_max_input_bytes(kDefaultMaxInput); }
};

std::string read_refusal(const std::string& path) {
  try {
    read_json_file(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "accepted";
}

TEST(InputLimit, AFileOrAStreamOverTheLimitIsRefusedNamingIt) {
  const fs::path dir = fresh_dir("input_limit");
  InputLimit limit(4096);
  const std::string doc = "[" + std::string(5000, ' ') + "1]";
  write_file_atomically((dir / "big.json").string(), doc);
  EXPECT_NE(read_refusal((dir / "big.json").string()).find("the file has 5003 bytes, more than the input limit of 4 KiB (4096 bytes)"),
            std::string::npos) << read_refusal((dir / "big.json").string());
  write_file_atomically((dir / "small.json").string(), "[" + std::string(4000, ' ') + "1]");
  EXPECT_EQ(read_json_file((dir / "small.json").string()), nlohmann::json::array({1}));
  // A FIFO: read as a stream, to the limit, with the writer still writing.
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t writer = ::fork();
  if (writer == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    const std::string spaces(1 << 16, ' ');
    for (int i = 0; i < 64; ++i)  // 4 MiB, then the end of the document
      if (::write(fd, spaces.data(), spaces.size()) < 0) ::_exit(0);
    ::_exit(::write(fd, "1", 1) < 0 ? 0 : 1);
  }
  const std::string r = read_refusal(fifo.string());
  ::kill(writer, SIGKILL);
  ::waitpid(writer, nullptr, 0);
  EXPECT_NE(r.find("it goes on longer than the input limit of 4 KiB"), std::string::npos) << r;
  EXPECT_NE(r.find("--max-input"), std::string::npos) << r;
  fs::remove_all(dir);
}

TEST(InputLimit, AStreamOfNulsIsRefusedAtOnce) {
  // /dev/zero at the default limit: the first chunk says it is no JSON (it used to read until
  // memory ran out).
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(read_refusal("/dev/zero").find("a NUL byte at line 1, column 1"), std::string::npos) << read_refusal("/dev/zero");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

// --- Debris (item 8) --------------------------------------------------------------------------------

TEST(Debris, WhatAKilledWriterLeftIsSweptAndLongNamesWrite) {
  const fs::path dir = fresh_dir("debris");
  // A writer killed partway: SIGXFSZ (the default action) at a 4 KiB file size limit.
  const int status = in_child([&] {
    rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    write_file_atomically((dir / "t.json").string(), std::string(100000, 'x'));
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << status;
  // A killed validate coordinator's directory; names meshsim did not make are never touched.
  in_child([&] { make_private_directory(dir.string(), "meshsim-validate"); });
  write_new_file((dir / ".t.json.Ab12Cd").string(), {"an older meshsim's, or not meshsim's"});
  write_new_file((dir / ".meshsim-zzzz-1-Ab12Cd").string(), {"not meshsim's"});
  ASSERT_EQ(entries(dir), 4u);
  // The next write into the directory (and the next validate) sweeps the dead writers'.
  const std::string name(255, 'n');
  write_file_atomically((dir / name).string(), "a name of 255 bytes");
  EXPECT_EQ(contents(dir / name), "a name of 255 bytes");
  const std::string mine = make_private_directory(dir.string(), "meshsim-validate");
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{name, ".t.json.Ab12Cd", ".meshsim-zzzz-1-Ab12Cd", fs::path(mine).filename().string()}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshsim
