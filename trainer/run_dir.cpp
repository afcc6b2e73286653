#include "trainer/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>

#include "formats/checkpoint_state.h"
#include "formats/json_error.h"
#include "trainer/checkpoint.h"
#include "trainer/file_util.h"
#include "trainer/train_loop.h"

// POSIX calls, not std::filesystem: see trainer/file_util.h for why.

namespace vlatune::trainer {

namespace {

// Entry names of a directory, "." and ".." left out, sorted; empty when it cannot be read.
std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_step_name(const std::string& name) {
  return name.size() == 13 && starts_with(name, "step_") &&
         std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// lstat's file type bits, 0 when the entry does not exist.
mode_t entry_type(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir) {
  try {
    make_directories(run_dir);
  } catch (const std::runtime_error& e) {
    throw TrainInputError(std::string("run directory: ") + e.what());
  }
  const std::string path = join_path(run_dir, kRunLockName);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) throw TrainInputError(path + ": cannot open the run's lock file: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw TrainInputError(run_dir + ": in use by another vlatune train" +
                            (n > 0 ? " (pid " + std::string(pid, static_cast<size_t>(n)) + ")" : std::string()) +
                            "; one run directory holds one run at a time");
    throw TrainInputError(path + ": cannot lock: " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // Best effort: the lock itself is what excludes; the pid only makes another run's refusal name the holder.
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
}

std::string new_run_id() {
  std::random_device device;  // /dev/urandom on Linux
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(bits));
  return hex;
}

std::string absolute_path(const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  std::vector<char> cwd(4096);
  while (::getcwd(cwd.data(), cwd.size()) == nullptr) {
    if (errno != ERANGE)
      throw std::runtime_error(std::string("cannot read the working directory: ") + std::strerror(errno));
    cwd.resize(cwd.size() * 2);
  }
  std::string rel = path;
  while (starts_with(rel, "./")) rel.erase(0, 2);
  return rel.empty() || rel == "." ? std::string(cwd.data()) : join_path(cwd.data(), rel);
}

void check_new_run_dir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (entry_type(dir) == S_IFLNK) throw TrainInputError("--out " + dir + ": a symbolic link to nothing");
    return;
  }
  if (!S_ISDIR(st.st_mode)) throw TrainInputError("--out " + dir + ": exists and is not a directory");
  std::vector<std::string> names = entries_of(dir);
  names.erase(std::remove(names.begin(), names.end(), kRunLockName), names.end());
  if (names.empty()) return;
  if (std::find(names.begin(), names.end(), "train_config.json") != names.end())
    throw TrainInputError("--out " + dir + ": already holds a run; continue it with --resume " + dir +
                          " or choose another directory");
  std::string listed;
  for (size_t i = 0; i < names.size() && i < 3; ++i) listed += (i ? ", " : "") + names[i];
  if (names.size() > 3) listed += ", ...";
  throw TrainInputError("--out " + dir + ": not empty and not a vlatune run (holds " + listed +
                        "); a new run needs a new or empty directory, and nothing in this one is touched");
}

std::vector<std::string> own_checkpoints(const std::string& run_dir, const std::string& run_id) {
  const std::string root = join_path(run_dir, "checkpoints");
  const mode_t type = entry_type(root);
  if (type == 0) return {};
  if (type != S_IFDIR)
    throw TrainInputError(root + ": not a directory of this run's checkpoints (" +
                          (type == S_IFLNK ? std::string("a symbolic link") : std::string("not a directory")) +
                          "); move it away to resume");
  std::vector<std::string> own;
  for (const std::string& name : entries_of(root)) {
    if (!starts_with(name, "step_")) continue;  // not a checkpoint name: never read, never touched
    const std::string dir = join_path(root, name);
    std::string why;
    if (!is_step_name(name)) {
      why = "not a checkpoint name of vlatune (step_ and 8 digits)";
    } else if (entry_type(dir) != S_IFDIR) {
      why = entry_type(dir) == S_IFLNK ? "a symbolic link" : "not a directory";
    } else {
      try {
        const formats::CheckpointState state = formats::read_checkpoint_state(join_path(dir, "state.json"));
        if (state.run_id != run_id) why = "written by run " + state.run_id + ", this run is " + run_id;
      } catch (const formats::FormatError& e) {
        why = std::string("its state.json is not valid: ") + e.what();
      }
    }
    if (!why.empty())
      throw TrainInputError(dir + ": not a checkpoint of this run that it can resume from (" + why +
                            "); it is left alone: move it out of " + root + " to resume");
    own.push_back(dir);
  }
  return own;
}

std::vector<std::string> remove_leftover_temporaries(const std::string& run_dir) {
  std::vector<std::string> lines;
  auto remove = [&lines](const std::string& path) {
    try {
      remove_tree(path);
      lines.push_back("removed " + path + " (left by an interrupted write)");
    } catch (const std::runtime_error& e) {
      lines.push_back(std::string("warning: ") + e.what());
    }
  };
  // Beside each file the trainer writes atomically: FILE.tmp.<suffix> (formats::write_file_atomic, safetensors).
  const std::vector<std::pair<std::string, std::vector<std::string>>> written = {
      {run_dir, {"train_config.json", "recipe.json", "run.json", "metrics.jsonl"}},
      {join_path(run_dir, "final"), {"model.safetensors", "norm_stats.json"}}};
  for (const auto& [dir, files] : written) {
    if (entry_type(dir) != S_IFDIR) continue;
    for (const std::string& name : entries_of(dir)) {
      const std::string path = join_path(dir, name);
      const bool ours = std::any_of(files.begin(), files.end(),
                                    [&name](const std::string& f) { return starts_with(name, f + ".tmp."); });
      if (ours && entry_type(path) == S_IFREG) remove(path);
    }
  }
  // Checkpoints being written or removed: checkpoints/.step_<8 digits>[.removing].tmp.
  const std::string root = join_path(run_dir, "checkpoints");
  if (entry_type(root) == S_IFDIR) {
    for (const std::string& name : entries_of(root)) {
      if (!starts_with(name, ".step_") || !ends_with(name, ".tmp")) continue;
      std::string step = name.substr(1, 13);
      if (!is_step_name(step)) continue;
      const std::string rest = name.substr(14);
      if (rest != ".tmp" && rest != ".removing.tmp") continue;
      const std::string path = join_path(root, name);
      const std::vector<std::string> warnings = remove_checkpoint_temporary(path);
      if (warnings.empty()) lines.push_back("removed " + path + " (left by an interrupted write)");
      for (const std::string& w : warnings) lines.push_back("warning: " + w);
    }
  }
  return lines;
}

}  // namespace vlatune::trainer
