// Running the meshsim binary as a process from a test: its exit code, output and time.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>

namespace meshsim::testing {

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Single-quoted for the shell.
inline std::string q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A fresh, empty directory for one test: TMPDIR/PREFIX_PID/NAME.
inline std::filesystem::path fresh_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Removes a directory of fresh_dir and, once empty, its TMPDIR/PREFIX_PID parent (each test runs
// in a process of its own under ctest: a parent per test would otherwise stay behind).
inline void remove_fresh_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::remove(dir.parent_path(), ec);  // only when empty
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Outcome {
  int code = -1;  // the exit code; 124 when the time limit was hit
  std::string out, err;
  double seconds = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "exit " << o.code << " after " << o.seconds << " s\n--- stdout\n" << o.out << "--- stderr\n" << o.err;
}

// Runs `BINARY ARGS` (ARGS already quoted as needed) in `dir`, killed after `limit_s`; its output
// goes through files in `dir` named after `tag`.
inline Outcome run_process(const std::filesystem::path& dir, const std::string& binary, const std::string& args,
                           int limit_s, const std::string& tag = "") {
  const std::filesystem::path out = dir / (".stdout" + tag), err = dir / (".stderr" + tag);
  const std::string cmd = "cd " + q(dir.string()) + " && timeout " + std::to_string(limit_s) + " " + q(binary) + " " +
                          args + " >" + q(out.string()) + " 2>" + q(err.string());
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  Outcome o;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  o.out = read_text(out);
  o.err = read_text(err);
  return o;
}

}  // namespace meshsim::testing
