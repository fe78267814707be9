// What the command line reads and writes when the paths are hostile (issue #37, items 2, 4, 5 and
// 8): outputs that are devices, FIFOs, streams, links or other users' files; inputs that never end;
// a --values directory written whole; what killed writers leave behind. docs/testing.md's
// hostile-input table lists these cases with their exit codes.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tests/process_fixture.h"

namespace fs = std::filesystem;
using namespace meshsim::testing;

namespace {

const fs::path kExamples = fs::path(MESHSIM_SOURCE_DIR) / "examples";

class HostileIo : public ProcessTest {
 protected:
  HostileIo() : ProcessTest("meshsim_test_hostile_io", 60) {}
  // An example copied into the test's directory, as `name`.
  void copy(const std::string& example, const fs::path& name) const {
    fs::create_directories((dir / name).parent_path());
    fs::copy_file(kExamples / example, dir / name, fs::copy_options::overwrite_existing);
  }
  // bash -c SCRIPT in the test's directory, MESHSIM naming the binary.
  Outcome shell(const std::string& script, int limit_s = 60) {
    return run_process(dir, "/bin/bash", "-c " + q("MESHSIM=" + q(MESHSIM_BIN) + "; " + script), limit_s,
                       "sh" + std::to_string(++calls));
  }
  // The names in the test's directory but for the captured outputs (.stdoutN, .stderrN).
  std::vector<std::string> names(const fs::path& in) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(in)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(".stdout", 0) != 0 && n.rfind(".stderr", 0) != 0) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

// Every file under a directory (by its path there) with a hash of its bytes.
std::map<std::string, size_t> digests(const fs::path& root) {
  std::map<std::string, size_t> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = std::hash<std::string>{}(read_text(e.path()));
  return out;
}

struct stat lstat_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st;
}

// Item 2: an output is written to what the path names, never replacing a device, a FIFO, a link or
// the standard output; a replaced file keeps its mode and owner.
TEST_F(HostileIo, OutputsAreWrittenToWhatThePathNames) {
  copy("fsdp_reduced.json", "s.json");
  // A FIFO, read by cat: the trace goes through it, and it stays a FIFO.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  Outcome f = shell("cat fifo > got & reader=$!; $MESHSIM run s.json --trace fifo --quiet; code=$?; "
                    "[ $code = 0 ] || kill $reader; wait; exit $code");  // no cat left waiting if meshsim failed
  EXPECT_EQ(f.code, 0) << f;
  EXPECT_TRUE(S_ISFIFO(lstat_of(dir / "fifo").st_mode));
  EXPECT_TRUE(contains(read_text(dir / "got"), "\"format\": \"meshsim.trace/1\"")) << f;
  // The standard output by name: after the verdict, in the file the shell opened.
  Outcome s = shell("$MESHSIM run s.json --quiet --trace /dev/fd/1 > out.txt");
  EXPECT_EQ(s.code, 0) << s;
  const std::string out = read_text(dir / "out.txt");
  EXPECT_TRUE(contains(out, "fsdp_reduced_linear: pass")) << out.substr(0, 300);
  EXPECT_TRUE(contains(out, "\"format\": \"meshsim.trace/1\"")) << out.substr(0, 300);
  // A link: followed; the file it names is replaced, the link stays.
  fs::create_directories(dir / "traces");
  fs::create_symlink("traces/t.json", dir / "link.json");
  EXPECT_EQ(meshsim("run s.json --quiet --trace link.json").code, 0);
  EXPECT_TRUE(fs::is_symlink(dir / "link.json"));
  EXPECT_TRUE(contains(read_text(dir / "traces" / "t.json"), "meshsim.trace/1"));
  // Another user's private file (as root): mode and owner kept. Any user: the mode.
  std::ofstream(dir / "private.svg") << "old";
  ASSERT_EQ(::chmod((dir / "private.svg").c_str(), 0600), 0);
  const bool root = ::geteuid() == 0;
  if (root) {
    ASSERT_EQ(::chown((dir / "private.svg").c_str(), 4321, 4321), 0);
  }
  EXPECT_EQ(meshsim("render s.json -o private.svg").code, 0);
  EXPECT_EQ(lstat_of(dir / "private.svg").st_mode & 07777, 0600u);
  if (root) {
    EXPECT_EQ(lstat_of(dir / "private.svg").st_uid, 4321u);
    // /dev/null's numbers in a node of our own: it stays a device (the machine's /dev/null is not
    // put at risk by this test).
    ASSERT_EQ(::mknod((dir / "null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0);
    EXPECT_EQ(meshsim("run s.json --quiet --trace null").code, 0);
    EXPECT_TRUE(S_ISCHR(lstat_of(dir / "null").st_mode)) << "the device node became a regular file";
  }
  Outcome d = meshsim("run s.json --quiet --trace traces");
  EXPECT_EQ(d.code, 2) << d;
  EXPECT_TRUE(contains(d.err, "traces: cannot write: it is a directory")) << d;
}

// Item 4: an input larger than --max-input, or a stream that goes on longer, is refused (exit 2,
// naming the limit); a stream of NULs at once; a stream that ends is read like a file.
TEST_F(HostileIo, InputsAreBoundedByMaxInput) {
  copy("fsdp_reduced.json", "s.json");
  const auto size = std::to_string(fs::file_size(dir / "s.json"));
  for (const std::string cmd : {"run s.json", "render s.json -o out.svg", "replay s.json", "explain s.json --op /program/0",
                                "validate s.json", "check --scenario s.json --cases 1"}) {
    const Outcome o = meshsim(cmd + " --max-input 100");
    EXPECT_EQ(o.code, 2) << cmd << "\n" << o;
    EXPECT_TRUE(contains(o.err, "s.json: /: the file has " + size + " bytes, more than the input limit of 100 bytes"))
        << cmd << "\n" << o;
  }
  EXPECT_EQ(meshsim("run s.json --quiet --max-input 1M").code, 0);
  // A stream that never ends: refused at the limit, not read until memory runs out.
  Outcome y = shell("yes '[' | $MESHSIM run /dev/stdin --max-input 1M");
  EXPECT_EQ(y.code, 2) << y;
  EXPECT_TRUE(contains(y.err, "/dev/stdin: /: it goes on longer than the input limit of 1 MiB")) << y;
  // /dev/zero at the default limit, in 3 GB of address space: the first chunk says it (it used to
  // read for 15-40 s and end out of memory, exit 6).
  Outcome z = shell("ulimit -v 3000000; exec $MESHSIM run /dev/zero", 30);
  EXPECT_EQ(z.code, 2) << z;
  EXPECT_TRUE(contains(z.err, "/dev/zero: /: a NUL byte at line 1, column 1")) << z;
  // Process substitution and a pipe: streams that end are read whole.
  EXPECT_EQ(shell("$MESHSIM run <(cat s.json) --quiet").code, 0);
  EXPECT_EQ(shell("$MESHSIM run /dev/stdin --quiet < s.json").code, 0);
  Outcome bad = meshsim("run s.json --max-input lots");
  EXPECT_EQ(bad.code, 2) << bad;
}

// Item 5: --values replaces its directory whole: a failure partway leaves the old one, files of an
// older run do not stay, and a directory holding the input is refused.
TEST_F(HostileIo, ValuesDirectoryIsReplacedWholeAndNeverHoldsTheInput) {
  copy("fsdp_reduced.json", "a.json");
  copy("bugs/bias_grad_off_by_tp.json", "b.json");
  ASSERT_EQ(meshsim("run a.json --quiet --values out").code, 0);
  std::ofstream(dir / "out" / "stale.npy") << "of an older run";
  ASSERT_EQ(meshsim("run a.json --quiet --values out").code, 0);
  EXPECT_FALSE(fs::exists(dir / "out" / "stale.npy")) << "a file of an older run stays";
  const std::map<std::string, size_t> before = digests(dir / "out");
  ASSERT_FALSE(before.empty());
  // A full disk (a 1 KiB file size limit) partway through b's files: a's directory, as it was.
  Outcome full = shell("ulimit -f 1; trap '' XFSZ; exec $MESHSIM run b.json --quiet --values out");
  EXPECT_EQ(full.code, 2) << full;
  EXPECT_TRUE(contains(full.err, "cannot write: File too large")) << full;
  EXPECT_TRUE(digests(dir / "out") == before) << "the directory mixes two runs";
  EXPECT_EQ(names(dir), (std::vector<std::string>{"a.json", "b.json", "out"})) << "a temporary directory is left";
  // The input inside DIR: refused, the input untouched.
  copy("fsdp_reduced.json", "in/s.json");
  const std::string text = read_text(dir / "in" / "s.json");
  for (const std::string args : {"run in/s.json --values in", "run in/s.json --values ./in/", "run in/s.json --values ."}) {
    Outcome o = meshsim(args);
    EXPECT_EQ(o.code, 2) << args << "\n" << o;
    EXPECT_TRUE(contains(o.err, "refused as --values: it holds the input in/s.json")) << args << "\n" << o;
  }
  EXPECT_EQ(read_text(dir / "in" / "s.json"), text);
  EXPECT_EQ(names(dir / "in"), (std::vector<std::string>{"s.json"}));
}

// Item 8: what a writer killed partway left is removed by the next write into the directory; a
// name of 255 bytes can be written.
TEST_F(HostileIo, KilledWritersTemporariesAreSweptAndLongNamesWrite) {
  copy("fsdp_reduced.json", "s.json");
  // SIGXFSZ's default action kills the writer in the middle of the trace.
  Outcome killed = shell("ulimit -f 4; exec $MESHSIM run s.json --quiet --trace t.json");
  EXPECT_EQ(killed.code, 128 + SIGXFSZ) << killed;
  ASSERT_EQ(names(dir).size(), 2u) << "no temporary file to sweep";
  const std::string name(255, 'n');
  Outcome o = meshsim("run s.json --quiet --trace " + name);
  EXPECT_EQ(o.code, 0) << o;
  EXPECT_EQ(names(dir), (std::vector<std::string>{name, "s.json"}));
}

}  // namespace
