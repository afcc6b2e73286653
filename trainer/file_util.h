// The few file-system operations the data code needs, on POSIX calls. Not std::filesystem: libtorch.so exports
// its own copies of ~140 std::filesystem functions built against another libstdc++, and in a process that
// links torch those win symbol resolution (tests/torch/test_model_safetensors.cpp saw remove_all jump to address 0).
#pragma once

#include <string>
#include <vector>

namespace vlatune::trainer {

// a + "/" + b (no doubled slash).
std::string join_path(const std::string& a, const std::string& b);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// True when `path` does not exist or is an empty directory: where a new dataset may be written.
bool is_fresh_output(const std::string& path);

// mkdir -p; throws std::runtime_error naming the path and the reason.
void make_directories(const std::string& path);

// Removes `path` and everything below it, never following a symbolic link (a link is removed, not its target).
// Nothing to do when it does not exist; throws std::runtime_error naming the entry that could not be removed.
void remove_tree(const std::string& path);

// Regular files under `dir` (recursively, symlinks followed) whose names end with one of `suffixes`, as paths
// starting with `dir`, sorted. Throws std::runtime_error when `dir` cannot be read.
std::vector<std::string> list_files_recursive(const std::string& dir, const std::vector<std::string>& suffixes);

}  // namespace vlatune::trainer
