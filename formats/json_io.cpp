#include "formats/json_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "formats/json_error.h"

namespace vlatune::formats {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Tracks the JSON path during parsing so that a repeated key can be reported where it occurs. nlohmann's parser
// callback sees keys and container boundaries in document order; each open container is one frame.
class DuplicateKeyGuard {
 public:
  explicit DuplicateKeyGuard(const std::string& file) : file_(file) {}

  bool on_event(nlohmann::json::parse_event_t event, const nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
        frames_.push_back(Frame{false, 0, {}, {}});
        break;
      case E::array_start:
        frames_.push_back(Frame{true, 0, {}, {}});
        break;
      case E::key: {
        Frame& top = frames_.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second) {
          throw FormatError(file_, path(), "duplicate key '" + top.key + "' (each key may appear once per object)");
        }
        break;
      }
      case E::object_end:
      case E::array_end:
        frames_.pop_back();
        element_done();
        break;
      case E::value:
        element_done();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool is_array;
    size_t next_index;
    std::string key;
    std::set<std::string> keys;
  };

  // A finished value advances the index of the array that holds it.
  void element_done() {
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().next_index;
  }

  std::string path() const {
    std::string p = "$";
    for (const Frame& f : frames_) p += f.is_array ? "[" + std::to_string(f.next_index) + "]" : "." + f.key;
    return p;
  }

  const std::string& file_;
  std::vector<Frame> frames_;
};

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(path, "", "cannot read: " + errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw FormatError(path, "", "read failed: " + errno_text());
  return ss.str();
}

nlohmann::json parse_json_text(const std::string& text, const std::string& file) {
  DuplicateKeyGuard guard(file);
  try {
    return nlohmann::json::parse(text, [&guard](int /*depth*/, nlohmann::json::parse_event_t event,
                                                nlohmann::json& parsed) { return guard.on_event(event, parsed); });
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 5: ..."; keep the part a user
    // can act on and add the byte offset (editors jump to it).
    std::string what = e.what();
    const auto bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    throw FormatError(file, "", "not valid JSON: at byte " + std::to_string(e.byte) + ": " + what);
  }
}

nlohmann::json read_json_file(const std::string& path) {
  return parse_json_text(read_text_file(path), path);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  // mkstemp gives a unique name, so two writers of the same path never share a temporary file.
  std::string tmp = path + ".tmp.XXXXXX";
  std::vector<char> tmpl(tmp.begin(), tmp.end());
  tmpl.push_back('\0');
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) throw FormatError(path, "", "cannot create a temporary file beside it: " + errno_text());
  tmp.assign(tmpl.data());
  auto fail = [&](const std::string& what) {
    const std::string err = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw FormatError(path, "", what + ": " + err);
  };
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    done += static_cast<size_t>(n);
  }
  // mkstemp creates 0600; a recipe or run record is an ordinary user file.
  if (::fchmod(fd, 0644) != 0) fail("chmod failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw FormatError(path, "", "close failed: " + err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw FormatError(path, "", "rename failed: " + err);
  }
  // The rename itself is durable only once the directory entry is on disk. Best effort: some filesystems refuse
  // fsync on a directory, and the data is already safe in the file.
  const int dir = ::open(dirname_of(path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::string dump_json_file(const nlohmann::json& j) {
  return j.dump(2) + "\n";
}

}  // namespace vlatune::formats
