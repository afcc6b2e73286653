// A fresh temporary directory per test case, removed afterwards (torch-free tier: std::filesystem is safe here).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace vlatune::test {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("vlatune_" + tag + "_XXXXXX")).string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

}  // namespace vlatune::test
