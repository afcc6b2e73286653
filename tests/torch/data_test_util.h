// Helpers shared by the test_data_*.cpp cases: a temporary directory tree removed afterwards, and byte-level
// file edits for the corruption cases. POSIX calls only (see trainer/file_util.h for why not std::filesystem).
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>

namespace vlatune::test {

struct TempTree {
  std::string dir;
  TempTree() {
    std::string tmpl = "/tmp/vlatune_data_XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~TempTree() {
    ::nftw(
        dir.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  TempTree(const TempTree&) = delete;
  TempTree& operator=(const TempTree&) = delete;
  std::string operator/(const std::string& name) const { return dir + "/" + name; }
};

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Overwrites `bytes.size()` bytes at `offset` in place.
inline void patch_file(const std::string& path, int64_t offset, const std::string& bytes) {
  std::string all = read_file_bytes(path);
  REQUIRE(offset + static_cast<int64_t>(bytes.size()) <= static_cast<int64_t>(all.size()));
  all.replace(static_cast<size_t>(offset), bytes.size(), bytes);
  write_file_bytes(path, all);
}

}  // namespace vlatune::test
