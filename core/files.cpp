#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include "core/error.h"

namespace meshsim {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// "line L, column C" of byte offset `byte` (counted from 1, as nlohmann counts).
std::string line_column(const std::string& text, size_t byte) {
  const size_t end = std::min(byte, text.size());
  size_t line = 1, column = 1;
  for (size_t i = 0; i + 1 < end; ++i) {
    if (text[i] == '\n')
      ++line, column = 1;
    else
      ++column;
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

// A JSON pointer token: '~' and '/' escaped (RFC 6901).
std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// A first pass over the text that builds nothing: it bounds the nesting and refuses repeated keys,
// naming the JSON path of the offence. Iterative (nlohmann's SAX parser keeps its own stack), so a
// document nested a million levels deep is refused without recursion.
class StrictScan {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  StrictScan(const std::string& text, const std::string& file) : text_(text), file_(file) {}

  bool null() { return scalar(); }
  bool boolean(bool) { return scalar(); }
  bool number_integer(number_integer_t) { return scalar(); }
  bool number_unsigned(number_unsigned_t) { return scalar(); }
  bool number_float(number_float_t, const string_t&) { return scalar(); }
  bool string(string_t&) { return scalar(); }
  bool binary(binary_t&) { return scalar(); }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(string_t& k) {
    Frame& f = frames_.back();
    f.key = k;
    if (!f.keys.insert(k).second)
      throw InputError(file_, path(),
                       "the key \"" + k + "\" appears twice in one object; JSON leaves which one counts open, "
                       "so meshsim takes neither: remove one");
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const json::exception& e) {
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line 1, column 2: why".
    std::string why = e.what();
    const auto colon = why.find(": ");
    why = colon == std::string::npos ? why : why.substr(colon + 2);
    throw InputError(file_, path(), "invalid JSON at " + line_column(text_, position) + ": " + why);
  }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;  // of the element being read, in an array
    std::string key;   // of the member being read, in an object
    std::unordered_set<std::string> keys;
  };

  // The JSON path of the element being read.
  std::string path() const {
    std::string out;
    for (const auto& f : frames_) out += "/" + (f.array ? std::to_string(f.index) : pointer_token(f.key));
    return out.empty() ? "/" : out;
  }
  bool scalar() {
    advance();
    return true;
  }
  bool open(bool array) {
    if (frames_.size() >= static_cast<size_t>(kMaxJsonDepth))
      throw InputError(file_, path(),
                       "nesting deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels; no scenario or trace nests that deep");
    frames_.push_back({array, 0, "", {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    advance();
    return true;
  }
  void advance() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }

  const std::string& text_;
  const std::string& file_;
  std::vector<Frame> frames_;
};

}  // namespace

json parse_json_text(const std::string& text, const std::string& file) {
  // nlohmann stops at a NUL byte as at the end of the input: what follows one would go unread.
  const size_t nul = text.find('\0');
  if (nul != std::string::npos)
    throw InputError(file, "/",
                     "a NUL byte at " + line_column(text, nul + 1) + " (byte " + std::to_string(nul) +
                         "): a JSON document has none; is this a JSON file?");
  StrictScan scan(text, file);
  json::sax_parse(text, &scan);  // throws InputError; strict: bytes after the document are an error
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // the scan accepted it: not expected, still said plainly
    throw InputError(file, "/", std::string("invalid JSON: ") + e.what());
  }
}

json read_json_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(path, "/", "cannot read: it is a directory");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path, "/", std::string("cannot read: ") + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(path, "/", std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return parse_json_text(text, path);
}

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // Hidden, unique, in the target's directory: the rename stays within one file system.
  std::string tmp = (dir / ("." + target.filename().string() + ".XXXXXX")).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw InputError(path, "", std::string("cannot write: ") + std::strerror(errno));
  bool open = true;
  auto give_up = [&](int err) {
    if (open) ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(path, "", std::string("cannot write: ") + std::strerror(err) + "; the file was left as it was");
  };
  // mkstemp makes the file 0600; a written file has the usual 0666 less the umask.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) give_up(errno);
  for (const auto& text : parts) {
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) give_up(errno);
      done += static_cast<size_t>(n);
    }
  }
  open = false;
  if (::close(fd) != 0) give_up(errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) give_up(errno);
}

void refuse_output_over_input(const std::string& option, const std::string& out,
                              const std::vector<std::string>& inputs) {
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::equivalent(out, in, ec) && !ec)
      throw InputError(out, "", "refused as " + option + ": it is the input " + in + ", which writing would replace; name another file");
  }
}

}  // namespace meshsim
