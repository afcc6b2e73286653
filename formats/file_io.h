// Files as every vlatune verb reads and writes them, on POSIX calls (libtorch.so exports its own std::filesystem
// symbols, so code linked into torch processes avoids std::filesystem):
//   - inputs are regular files of bounded size: a FIFO, a device (/dev/zero), a socket or a directory where a file
//     is expected is refused at once, without blocking and without reading;
//   - outputs are written to a temporary name beside the target and renamed over it (AtomicFile): a reader never
//     sees a half-written file, a failed write leaves no partial file, and names up to the 255-byte limit work;
//   - a failed write (disk full, read-only filesystem, permission) is a WriteError naming the file and the OS
//     error: the verb failed (exit 1). Bad input is a FormatError (exit 4).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vlatune::formats {

// An output that could not be written. what(): "<file>: <reason>: <OS error>".
class WriteError : public std::runtime_error {
 public:
  WriteError(std::string file, std::string reason);
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// The largest JSON document any reader accepts (a full-size profile.json is a few MB; a run.json of a million
// steps about 60 MB). Larger is a corrupt or foreign file, refused before it is read into memory.
inline constexpr uint64_t kMaxJsonFileBytes = 256ull << 20;

// Opens `path` read-only if it is a regular file and returns the descriptor (the caller closes it); `size` gets its
// size. Missing, unreadable, not a regular file (FIFO, device, socket, directory: opened non-blocking, so a FIFO
// without a writer cannot hang), or larger than `max_bytes` -> FormatError(path, "", reason).
int open_regular_file(const std::string& path, uint64_t max_bytes, uint64_t* size);

// The whole file as bytes, through open_regular_file. Errors: FormatError naming the file.
std::string read_text_file(const std::string& path, uint64_t max_bytes = kMaxJsonFileBytes);

// Writes a file under a temporary name in the target's directory and renames it over the target on commit(). The
// temporary name is the target's name + ".tmp.XXXXXX" (mkstemp), with the name cut so that it stays within the
// 255-byte limit of a file name. Destroyed without commit(): the temporary file is removed. Every failure is a
// WriteError naming the target and the OS error, after the temporary file has been removed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, uint64_t bytes);
  // fsync, mode 0644, rename over the target, fsync of the directory (best effort: the data is already safe).
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);

  std::string path_, tmp_;
  int fd_ = -1;
};

// AtomicFile with one write.
void write_file_atomic(const std::string& path, const std::string& content);

// The temporary name AtomicFile uses for `path`, before mkstemp fills the X's.
std::string temp_name_beside(const std::string& path);

// True when `a` and `b` are the same file: the same device and inode when both exist, otherwise the same path once
// "." and ".." components and repeated slashes are removed (relative paths against the working directory). For
// refusing an output that would overwrite one of the command's inputs.
bool same_file(const std::string& a, const std::string& b);

// Bytes an unprivileged writer may still write on the filesystem holding `path` (or its nearest existing parent
// directory when `path` does not exist yet). Throws WriteError when no parent can be examined.
uint64_t available_bytes(const std::string& path);

// Throws WriteError when fewer than `bytes` (plus a 1% and 16 MiB margin) are available for `path`, naming what
// needs the space, the amount needed and the amount available.
void require_free_space(const std::string& path, uint64_t bytes, const std::string& what);

}  // namespace vlatune::formats
