#include "formats/file_io.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "formats/json_error.h"

namespace vlatune::formats {

namespace {

constexpr size_t kMaxNameBytes = 255;  // NAME_MAX of Linux filesystems
constexpr const char* kTempSuffix = ".tmp.XXXXXX";

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// "." and ".." and repeated slashes removed, made absolute against the working directory; no symlinks resolved.
std::string lexically_normal(const std::string& path) {
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    std::vector<char> cwd(PATH_MAX + 1, '\0');
    if (::getcwd(cwd.data(), cwd.size()) != nullptr) full = std::string(cwd.data()) + "/" + full;
  }
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= full.size()) {
    size_t slash = full.find('/', start);
    if (slash == std::string::npos) slash = full.size();
    const std::string part = full.substr(start, slash - start);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = slash + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

// The real path of `path`, or of its parent joined with its name when it does not exist yet.
std::string canonical_or_parent(const std::string& path) {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  if (::realpath(path.c_str(), buf.data()) != nullptr) return buf.data();
  if (::realpath(dirname_of(path).c_str(), buf.data()) != nullptr) {
    const std::string dir = buf.data();
    return (dir == "/" ? "" : dir) + "/" + basename_of(path);
  }
  return lexically_normal(path);
}

}  // namespace

WriteError::WriteError(std::string file, std::string reason)
    : std::runtime_error(file + ": " + reason), file_(std::move(file)) {}

int open_regular_file(const std::string& path, uint64_t max_bytes, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw FormatError(path, "", "cannot read: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw FormatError(path, "", "cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(path, "", std::string("is ") + file_kind(st.st_mode) + ", not a regular file");
  }
  const auto bytes = static_cast<uint64_t>(st.st_size);
  if (bytes > max_bytes) {
    ::close(fd);
    throw FormatError(path, "",
                      std::to_string(bytes) + " bytes is more than the " + std::to_string(max_bytes) +
                          "-byte limit for this file (a corrupt or foreign file?)");
  }
  // Regular files never block; reads go back to the ordinary mode anyway.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (size != nullptr) *size = bytes;
  return fd;
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, max_bytes, &size);
  std::string text;
  text.resize(static_cast<size_t>(size));
  size_t done = 0;
  // Reads to the end, not to the size seen at open: a file that grows while read stays within the limit.
  while (true) {
    if (done == text.size()) {
      if (text.size() > max_bytes) {
        ::close(fd);
        throw FormatError(path, "", "grew past the " + std::to_string(max_bytes) + "-byte limit while being read");
      }
      text.resize(text.size() + 4096);
    }
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw FormatError(path, "", "read failed: " + errno_text(err));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

std::string temp_name_beside(const std::string& path) {
  const std::string dir = dirname_of(path);
  std::string name = basename_of(path);
  const size_t room = kMaxNameBytes - std::strlen(kTempSuffix);
  if (name.size() > room) name.resize(room);
  return (path.find('/') == std::string::npos ? std::string() : (dir == "/" ? "/" : dir + "/")) + name + kTempSuffix;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // mkstemp gives a unique name, so two writers of the same path never share a temporary file.
  std::string tmpl = temp_name_beside(path_);
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  fd_ = ::mkstemp(buf.data());
  if (fd_ < 0) {
    const int err = errno;
    throw WriteError(path_, "cannot create a temporary file beside it: " + errno_text(err));
  }
  tmp_.assign(buf.data());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  throw WriteError(path_, what + ": " + errno_text(err) + " (nothing written)");
}

void AtomicFile::write(const void* data, uint64_t bytes) {
  if (fd_ < 0) throw WriteError(path_, "write after commit or failure");
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most 0x7ffff000 bytes per call; larger requests come back short.
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed", n < 0 ? errno : ENOSPC);
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw WriteError(path_, "commit after commit or failure");
  // mkstemp creates 0600; outputs are ordinary user files.
  if (::fchmod(fd_, 0644) != 0) fail("chmod failed", errno);
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close failed", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename failed", errno);
  tmp_.clear();
  // The rename is durable only once the directory entry is on disk. Best effort: some filesystems refuse fsync on
  // a directory, and the data is already safe in the file.
  const int dir = ::open(dirname_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile file(path);
  file.write(content.data(), content.size());
  file.commit();
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return canonical_or_parent(a) == canonical_or_parent(b);
}

uint64_t available_bytes(const std::string& path) {
  std::string probe = path.empty() ? "." : path;
  while (true) {
    struct statvfs vfs {};
    if (::statvfs(probe.c_str(), &vfs) == 0) return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (errno != ENOENT && errno != ENOTDIR)
      throw WriteError(path, "cannot examine its filesystem: " + errno_text(errno));
    const std::string parent = dirname_of(probe);
    if (parent == probe) throw WriteError(path, "no existing parent directory");
    probe = parent;
  }
}

void require_free_space(const std::string& path, uint64_t bytes, const std::string& what) {
  const uint64_t need = bytes + bytes / 100 + (16ull << 20);
  const uint64_t have = available_bytes(path);
  if (have < need) {
    auto mib = [](uint64_t b) { return std::to_string((b + (1ull << 20) - 1) >> 20) + " MiB"; };
    throw WriteError(path, what + " needs about " + mib(need) + " but the filesystem has " + mib(have) +
                               " available (free some space or choose another directory)");
  }
}

}  // namespace vlatune::formats
