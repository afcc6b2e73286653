#include "trainer/file_util.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace vlatune::trainer {

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_fresh_output(const std::string& path) {
  if (!path_exists(path)) return true;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return false;  // a file, or unreadable
  bool empty = true;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  ::closedir(dir);
  return empty;
}

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path) == 0 ? 0 : errno;
}
}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) throw std::runtime_error(path + ": cannot remove: " + std::strerror(errno));
    return;
  }
  const int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) throw std::runtime_error(path + ": cannot remove: " + std::strerror(rc > 0 ? rc : errno));
}

void make_directories(const std::string& path) {
  // Create each prefix in turn; EEXIST on a directory is fine (another process may race us).
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && !(errno == EEXIST && is_directory(prefix)))
      throw std::runtime_error(prefix + ": cannot create directory: " + std::strerror(errno));
  }
}

namespace {

void walk(const std::string& dir, const std::vector<std::string>& suffixes, std::vector<std::string>& out, int depth) {
  if (depth > 32) return;  // a symlink cycle; LIBERO trees are two levels deep
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw std::runtime_error(dir + ": cannot list: " + std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const auto& name : names) {
    const std::string path = join_path(dir, name);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;  // a dangling link
    if (S_ISDIR(st.st_mode)) {
      walk(path, suffixes, out, depth + 1);
    } else if (S_ISREG(st.st_mode)) {
      for (const auto& s : suffixes)
        if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
          out.push_back(path);
          break;
        }
    }
  }
}

}  // namespace

std::vector<std::string> list_files_recursive(const std::string& dir, const std::vector<std::string>& suffixes) {
  std::vector<std::string> out;
  walk(dir, suffixes, out, 0);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace vlatune::trainer
