// The output side of core/files.h: what a path names (a file, a link, a stream), a file or a
// directory replaced whole, and the sweep of what killed writers left behind.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/files.h"

namespace meshsim {

namespace fs = std::filesystem;

namespace {

// The stem of write_file_atomically's and write_directory_atomically's temporaries.
const std::string kStem = ".meshsim";

// At most this many symbolic links are followed (Linux's own bound).
constexpr int kMaxLinks = 40;

// Four hex digits of the host name's hash (FNV-1a): a temporary of another host sharing the
// directory is never taken for a dead process's.
const std::string& host_tag() {
  static const std::string tag = [] {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    uint32_t h = 2166136261u;
    for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
    char out[8];
    std::snprintf(out, sizeof out, "%04x", static_cast<unsigned>((h ^ (h >> 16)) & 0xffff));
    return std::string(out);
  }();
  return tag;
}

// DIR/STEM-HOST-PID-XXXXXX, for mkstemp and mkdtemp: its length does not depend on the target's.
std::string temp_template(const fs::path& dir, const std::string& stem) {
  return (dir / (stem + "-" + host_tag() + "-" + std::to_string(::getpid()) + "-XXXXXX")).string();
}

// The PID in a name STEM-HOST-PID-XXXXXX of this host; -1 for any other name.
pid_t owner_of(const std::string& name, const std::string& stem) {
  const std::string head = stem + "-" + host_tag() + "-";
  if (name.compare(0, head.size(), head) != 0) return -1;
  const size_t dash = name.find('-', head.size());
  if (dash == std::string::npos || name.size() != dash + 7) return -1;
  const std::string digits = name.substr(head.size(), dash - head.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return static_cast<pid_t>(std::stol(digits));
}

bool dead(pid_t pid) { return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH; }

// The descriptor that a name of this process's own open files stands for (/dev/stdout,
// /dev/fd/N, /proc/self/fd/N), or -1.
int descriptor_of(const fs::path& absolute) {
  const std::string s = absolute.lexically_normal().string();
  if (s == "/dev/stdin") return 0;
  if (s == "/dev/stdout") return 1;
  if (s == "/dev/stderr") return 2;
  for (const std::string& dir : {std::string("/dev/fd/"), std::string("/proc/self/fd/"), std::string("/proc/thread-self/fd/"),
                                 "/proc/" + std::to_string(::getpid()) + "/fd/"}) {
    if (s.size() <= dir.size() || s.compare(0, dir.size(), dir) != 0) continue;
    const std::string n = s.substr(dir.size());
    if (n.size() <= 9 && n.find_first_not_of("0123456789") == std::string::npos) return std::stoi(n);
  }
  return -1;
}

// What an output path names once its links are followed.
struct Target {
  fs::path path;          // the file (or directory) itself: not a link
  int descriptor = -1;    // >= 0: one of this process's open descriptors, by name
  bool exists = false;
  struct stat st {};      // lstat of path, when it exists
};

[[noreturn]] void cannot(const std::string& shown, const std::string& why, const char* left = "") {
  throw InputError(shown, "", "cannot write: " + why + left);
}

// `path` followed to what it names; errors name `shown`, the path as the user spelt it.
Target resolve(const std::string& shown, const fs::path& path) {
  fs::path p = path.lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();  // "out/"
  for (int links = 0; links <= kMaxLinks; ++links) {
    std::error_code ec;
    Target t;
    t.path = p;
    t.descriptor = descriptor_of(fs::absolute(p, ec));
    if (t.descriptor >= 0) return t;
    if (::lstat(p.c_str(), &t.st) != 0) {
      if (errno == ENOENT) return t;
      cannot(shown, std::strerror(errno));
    }
    t.exists = true;
    if (!S_ISLNK(t.st.st_mode)) return t;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) cannot(shown, ec.message());
    p = (to.is_absolute() ? to : p.parent_path() / to).lexically_normal();
  }
  cannot(shown, std::strerror(ELOOP));
}

// 0 or errno.
int write_all(int fd, const std::vector<std::string_view>& parts) {
  for (const auto& text : parts) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      done += static_cast<size_t>(n);
    }
  }
  return 0;
}

// Flushes a directory's entries to disk (a rename in it, a file made in it); best effort.
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

fs::path directory_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// The mode (and, where this process may set it, the owner) that replaces `t`: the old one's, or
// for a new one the usual `base` less the umask. 0 or errno.
int take_over(int fd, const Target& t, mode_t base) {
  if (t.exists && ::fchown(fd, t.st.st_uid, t.st.st_gid) != 0 && errno != EPERM) return errno;
  mode_t mode = 0;
  if (t.exists) {
    mode = t.st.st_mode & 07777;
  } else {
    // Read once: umask() can only be read by setting it, and a 0 umask even for a moment would give
    // files another thread makes then mode 0666.
    static const mode_t mask = [] {
      const mode_t m = ::umask(0);
      ::umask(m);
      return m;
    }();
    mode = base & ~mask;
  }
  return ::fchmod(fd, mode) == 0 ? 0 : errno;
}

// Write `parts` to what `t` names without replacing it: a device, a FIFO, an open descriptor.
void write_stream(const std::string& shown, const Target& t, const std::vector<std::string_view>& parts) {
  if (t.descriptor >= 0) {
    std::fflush(nullptr);  // what was printed before comes first (std::cout writes through stdio)
    if (const int err = write_all(t.descriptor, parts)) cannot(shown, std::strerror(err));
    return;
  }
  const int fd = ::open(t.path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) cannot(shown, std::strerror(errno));
  const int err = write_all(fd, parts);
  if (::close(fd) != 0 && err == 0) cannot(shown, std::strerror(errno));
  if (err) cannot(shown, std::strerror(err));
}

void replace_file(const std::string& shown, const Target& t, const std::vector<std::string_view>& parts) {
  const fs::path dir = directory_of(t.path);
  sweep_dead_temporaries(dir.string(), kStem);
  std::string tmp = temp_template(dir, kStem);
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) cannot(shown, std::strerror(errno), "; the file was left as it was");
  bool open = true;
  auto give_up = [&](int err) {
    if (open) ::close(fd);
    ::unlink(tmp.c_str());
    cannot(shown, std::strerror(err), "; the file was left as it was");
  };
  if (const int err = take_over(fd, t, 0666)) give_up(err);
  if (const int err = write_all(fd, parts)) give_up(err);
  if (::fsync(fd) != 0) give_up(errno);
  open = false;
  if (::close(fd) != 0) give_up(errno);
  if (::rename(tmp.c_str(), t.path.c_str()) != 0) give_up(errno);
  sync_directory(dir);
}

// Flushes every directory of a tree (the files in it were flushed as written).
void sync_tree(const fs::path& root) {
  sync_directory(root);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && !it->is_symlink(ec)) sync_directory(it->path());
}

// Puts `staging` where `target` is: -1 when there was nothing there; 0 when swapped, the old
// directory now at `staging`; errno when it cannot.
int swap_in(const fs::path& staging, const fs::path& target, bool exists) {
  if (!exists) {
    if (::rename(staging.c_str(), target.c_str()) == 0) return -1;  // nothing old to remove
    if (errno != EEXIST && errno != ENOTEMPTY) return errno;         // else: made meanwhile, swapped below
  }
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  // A file system without RENAME_EXCHANGE: the old directory moved aside first, then the new in.
  std::string aside = temp_template(directory_of(target), kStem);
  if (!::mkdtemp(aside.data())) return errno;
  if (::rename(target.c_str(), aside.c_str()) != 0) {
    const int err = errno;
    ::rmdir(aside.c_str());
    return err;
  }
  if (::rename(staging.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::rename(aside.c_str(), target.c_str());
    return err;
  }
  std::error_code ec;
  fs::remove_all(aside, ec);
  return -1;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts) {
  const Target t = resolve(path, path);
  if (t.descriptor >= 0 || (t.exists && (S_ISCHR(t.st.st_mode) || S_ISFIFO(t.st.st_mode))))
    return write_stream(path, t, parts);
  if (t.exists && S_ISDIR(t.st.st_mode)) cannot(path, "it is a directory");
  if (t.exists && !S_ISREG(t.st.st_mode))
    cannot(path, std::string("it is a ") + (S_ISBLK(t.st.st_mode) ? "block device" : "socket") +
                     "; meshsim writes files, character devices and FIFOs");
  replace_file(path, t, parts);
}

void write_new_file(const std::string& path, const std::vector<std::string_view>& parts) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) cannot(path, std::strerror(errno));
  int err = write_all(fd, parts);
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) {
    ::unlink(path.c_str());
    cannot(path, std::strerror(err));
  }
}

void write_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& fill) {
  // Absolute, so that `--values .` has a parent to be swapped in.
  std::error_code ec;
  const fs::path absolute = fs::absolute(dir, ec);
  if (ec) cannot(dir, ec.message(), "; the directory was left as it was");
  const Target t = resolve(dir, absolute);
  const char* left = "; the directory was left as it was";
  if (t.descriptor >= 0 || (t.exists && !S_ISDIR(t.st.st_mode))) cannot(dir, "it is not a directory", left);
  const fs::path parent = directory_of(t.path);
  std::error_code made;
  fs::create_directories(parent, made);  // as `--values a/b/c` always did
  if (made) cannot(dir, made.message(), left);
  sweep_dead_temporaries(parent.string(), kStem);
  std::string staging = temp_template(parent, kStem);
  if (!::mkdtemp(staging.data())) cannot(dir, std::strerror(errno), left);
  auto remove_staging = [&] {
    std::error_code ec;
    fs::remove_all(staging, ec);
  };
  try {
    const int fd = ::open(staging.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int err = fd < 0 ? errno : take_over(fd, t, 0777);
    if (fd >= 0) ::close(fd);
    if (err) cannot(dir, std::strerror(err), left);
    fill(staging);
    sync_tree(staging);
  } catch (...) {
    remove_staging();
    throw;
  }
  const int err = swap_in(staging, t.path, t.exists);
  if (err > 0) {
    remove_staging();
    cannot(dir, std::strerror(err), left);
  }
  sync_directory(parent);
  if (err == 0) remove_staging();  // the old directory, swapped out
}

void refuse_output_over_input(const std::string& option, const std::string& out,
                              const std::vector<std::string>& inputs) {
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::equivalent(out, in, ec) && !ec)
      throw InputError(out, "", "refused as " + option + ": it is the input " + in + ", which writing would replace; name another file");
  }
}

void refuse_directory_over_input(const std::string& option, const std::string& dir,
                                 const std::vector<std::string>& inputs) {
  std::error_code ec;
  const fs::path d = fs::weakly_canonical(dir, ec);
  if (ec) return;
  for (const auto& in : inputs) {
    const fs::path f = fs::weakly_canonical(in, ec);
    if (ec) continue;
    const fs::path rel = f.lexically_relative(d);
    if (!rel.empty() && *rel.begin() != "..")
      throw InputError(dir, "", "refused as " + option + ": it " + (rel == "." ? "is" : "holds") + " the input " + in +
                                    ", which replacing the directory would remove; name another directory");
  }
}

std::string make_private_directory(const std::string& parent, const std::string& stem) {
  sweep_dead_temporaries(parent, stem);
  std::string path = temp_template(parent, stem);
  if (!::mkdtemp(path.data())) throw std::runtime_error("cannot make a private directory in " + parent + ": " + std::strerror(errno));
  return path;
}

void sweep_dead_temporaries(const std::string& dir, const std::string& stem) {
  static std::mutex mutex;
  static std::set<std::string> swept;
  std::error_code ec;
  const std::string key = fs::absolute(dir.empty() ? "." : dir, ec).lexically_normal().string() + '\n' + stem;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!swept.insert(key).second) return;
  }
  for (fs::directory_iterator it(dir.empty() ? "." : dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (!dead(owner_of(it->path().filename().string(), stem))) continue;
    if (::lstat(it->path().c_str(), &st) != 0 || st.st_uid != ::geteuid()) continue;  // only this user's own
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
}

}  // namespace meshsim
