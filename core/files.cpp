#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <unordered_set>

#include "core/error.h"

namespace meshsim {

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

namespace {

std::atomic<uint64_t> g_max_input{kDefaultMaxInput};

// "1 GiB (1073741824 bytes)".
std::string limit_words(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  size_t u = 0;
  uint64_t v = bytes;
  while (u + 1 < std::size(units) && v >= 1024 && v % 1024 == 0) v /= 1024, ++u;
  return std::to_string(v) + " " + units[u] + (u ? " (" + std::to_string(bytes) + " bytes)" : "");
}

[[noreturn]] void too_large(const std::string& path, const std::string& what) {
  throw InputError(path, "/",
                   what + " than the input limit of " + limit_words(g_max_input.load()) +
                       "; no scenario or trace is that large: is this the file meant? (raise the limit with "
                       "--max-input SIZE)");
}

}  // namespace

void set_max_input_bytes(uint64_t bytes) { g_max_input.store(bytes); }
uint64_t max_input_bytes() { return g_max_input.load(); }

json read_json_file(const std::string& path) {
  // Opened as cat opens it: a FIFO without a writer waits for one (docs/scenario-format.md).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path, "/", std::string("cannot read: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InputError(path, "/", std::string("cannot read: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(path, "/", "cannot read: it is a directory");
  const uint64_t limit = g_max_input.load();
  std::string text;
  if (S_ISREG(st.st_mode)) {
    if (static_cast<uint64_t>(st.st_size) > limit)
      too_large(path, "the file has " + std::to_string(st.st_size) + " bytes, more");
    text.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(path, "/", std::string("cannot read: ") + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    // A stream of NULs (/dev/zero) or random bytes is no JSON: said now, not after the limit.
    if (std::memchr(buf, '\0', static_cast<size_t>(n))) break;
    if (text.size() > limit) too_large(path, "it goes on longer");
  }
  return parse_json_text(text, path);
}

}  // namespace meshsim
