// Reading JSON strictly and writing files whole: the input side and the output side of every file
// meshsim touches (DESIGN.md, contracts 2-4).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshsim {

// The deepest nesting a document may have. Scenarios and traces nest about ten levels; the bound
// is checked while scanning, before any document is built, so no reader recurses past it.
inline constexpr int kMaxJsonDepth = 100;

// Parses one JSON document strictly: InputError (exit 2) naming `file`, the JSON path and the line
// and column for a syntax error, a NUL byte, bytes after the document, nesting deeper than
// kMaxJsonDepth, or a key repeated within one object (JSON leaves which one counts open, so
// meshsim takes neither).
nlohmann::json parse_json_text(const std::string& text, const std::string& file);

// The most bytes an input file may have (--max-input; 1 GiB unless set): a scenario is kilobytes,
// the trace of a 100,000-op program on 4 ranks about 190 MB. read_json_file refuses a larger file,
// or a stream (a FIFO, a device, /dev/stdin, <(...)) that goes on longer, with InputError naming
// the limit, having read at most the limit and one chunk more.
inline constexpr uint64_t kDefaultMaxInput = uint64_t{1} << 30;
void set_max_input_bytes(uint64_t bytes);
uint64_t max_input_bytes();

// read_json_file: parse_json_text on a file's bytes; InputError with the reason (errno's words)
// when it cannot be read, when it is a directory, or beyond max_input_bytes(). A stream is read to
// its end, as cat reads it: a FIFO without a writer waits for one; a NUL byte (no JSON text has
// one: /dev/zero, /dev/urandom) stops the read at once.
nlohmann::json read_json_file(const std::string& path);

// Writes `text` to `path` so that a reader sees the old file or the new one, whole (InputError
// naming the path and why, errno's words, when it cannot; nothing is left behind then):
// - a regular file (or none yet) is written to a temporary file in the same directory, flushed to
//   disk (fsync), renamed over it, and the directory flushed; the old file's permission bits are
//   kept (its owner too, when meshsim may set it: as root), a new file has 0666 less the umask;
// - a symbolic link is followed (to 40 links): the file it points to is replaced, in that file's
//   directory, and the link stays a link;
// - a character device or a FIFO (/dev/null, a terminal, mkfifo's) is written as a stream, opened
//   and written, never replaced (a FIFO waits for a reader, as `echo > FIFO` does); the standard
//   streams by name (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N) are written to the
//   open descriptor itself, after what meshsim printed before;
// - a directory, a block device or a socket is refused.
// The temporary file is `.meshsim-HOST-PID-XXXXXX` (HOST four hex digits of the host name's hash),
// so a name of 255 bytes can be written; those a killed writer left (its PID no longer running on
// this host) are removed by the first write of a later meshsim into the directory.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts);
inline void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, std::vector<std::string_view>{text});
}

// Creates `path`, which must not exist, with `parts`, flushed to disk: a file of a directory that
// write_directory_atomically is building.
void write_new_file(const std::string& path, const std::vector<std::string_view>& parts);

// Replaces the directory `dir` (a symbolic link followed, as above) by one that `fill` writes: fill
// is given a fresh temporary directory beside DIR (`.meshsim-HOST-PID-XXXXXX`, removed when fill
// throws, and swept as above when the writer is killed) to fill; it is flushed and swapped with DIR
// in one rename (renameat2 RENAME_EXCHANGE; two renames where the file system cannot), and the old
// directory is removed after. A reader, or a writer killed at any point, sees the old directory or
// the new one whole; concurrent writers leave one run's directory. DIR keeps its permission bits;
// its parent is created when missing.
void write_directory_atomically(const std::string& dir, const std::function<void(const std::string&)>& fill);

// Refuses (InputError naming the option) an output path that names one of the inputs, as the
// same file under any spelling (`run s.json --trace ./s.json` would replace the scenario).
void refuse_output_over_input(const std::string& option, const std::string& out,
                              const std::vector<std::string>& inputs);

// Refuses (InputError naming the option) an output directory that is one of the inputs or holds
// one, at any depth and under any spelling: replacing the directory would remove it.
void refuse_directory_over_input(const std::string& option, const std::string& dir,
                                 const std::vector<std::string>& inputs);

// A fresh private (0700) directory PARENT/STEM-HOST-PID-XXXXXX, after removing those of STEM that
// processes no longer running on this host left in PARENT (a SIGKILLed `meshsim validate`'s).
// std::runtime_error with errno's words when it cannot be made.
std::string make_private_directory(const std::string& parent, const std::string& stem);

// Removes what write_file_atomically, write_directory_atomically or make_private_directory left in
// `dir` under `stem` ("." + "meshsim" for the first two) for a process of this host no longer
// running. Once a process per directory and stem; a name of another host, or of a live process, or
// of another form, is never touched.
void sweep_dead_temporaries(const std::string& dir, const std::string& stem);

}  // namespace meshsim
