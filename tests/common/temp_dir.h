// Temporary directories for the tests of both tiers: a fresh /tmp/vlatune_<tag>_XXXXXX per call. POSIX calls, not
// std::filesystem: libtorch.so exports its own copies of std::filesystem functions (built against another
// libstdc++), which win symbol resolution in a process that links torch; their remove_all jumped to address 0.
#pragma once

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <stdexcept>
#include <string>

namespace vlatune::test {

// A new empty directory, left in place (for output a failing case should leave behind to inspect).
inline std::string make_temp_dir(const std::string& tag) {
  std::string tmpl = "/tmp/vlatune_" + tag + "_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

// Removes `dir` and everything below it, without following symbolic links.
inline void remove_tree(const std::string& dir) {
  ::nftw(
      dir.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// A new empty directory, removed with its contents at the end of the scope.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) : path(make_temp_dir(tag)) {}
  ~TempDir() { remove_tree(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::string operator/(const std::string& name) const { return file(name); }
};

}  // namespace vlatune::test
