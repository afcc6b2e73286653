#include "trainer/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "formats/json_error.h"
#include "formats/json_io.h"
#include "model/safetensors_io.h"
#include "model/state_dict.h"
#include "trainer/checksum.h"
#include "trainer/file_util.h"

// POSIX calls throughout, not std::filesystem: see trainer/file_util.h for why.

namespace vlatune::trainer {

namespace {

constexpr const char* kPrefix = "step_";

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  throw std::runtime_error("checkpoint: " + what + " '" + path + "': " + std::strerror(errno));
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%08lld", kPrefix, static_cast<long long>(step));
  return buf;
}

bool is_step_dir_name(const std::string& name) {
  return name.size() == 13 && name.rfind(kPrefix, 0) == 0 &&
         std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_real_directory(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail_errno("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) fail_errno("cannot fsync", path);  // EINVAL: fs without directory fsync
}

std::string checkpoints_root(const std::string& run_dir) {
  return join_path(run_dir, "checkpoints");
}

// The state of a checkpoint directory when it is `run_id`'s, else nullopt.
std::optional<formats::CheckpointState> owned_state(const std::string& dir, const std::string& run_id) {
  if (!is_real_directory(dir)) return std::nullopt;
  try {
    formats::CheckpointState state = formats::read_checkpoint_state(join_path(dir, "state.json"));
    if (state.run_id == run_id) return state;
  } catch (const formats::FormatError&) {
  }
  return std::nullopt;
}

// Unlinks `names` in `dir` (unlink never follows a link; a missing one is fine), then removes `dir` itself.
void remove_named_then_directory(const std::string& dir, const std::vector<std::string>& names,
                                 std::vector<std::string>& warnings) {
  for (const std::string& file : names) {
    const std::string path = join_path(dir, file);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      warnings.push_back("could not remove " + path + ": " + std::strerror(errno));
  }
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT)
    warnings.push_back("could not remove " + dir + ": " + std::strerror(errno) +
                       (errno == ENOTEMPTY ? " (it holds files this run did not write; left in place)" : ""));
}

// Removes checkpoint `dir` of this run: renamed to a temporary name first (so it stops being a checkpoint at
// once), then the files its state names and state.json are unlinked, then the directory. Failures become warnings.
void remove_own_checkpoint(const std::string& dir, const formats::CheckpointState& state,
                           std::vector<std::string>& warnings) {
  const std::string root = dir.substr(0, dir.rfind('/'));
  const std::string name = dir.substr(dir.rfind('/') + 1);
  const std::string doomed = join_path(root, "." + name + ".removing.tmp");
  for (const std::string& line : remove_checkpoint_temporary(doomed)) warnings.push_back(line);
  if (::rename(dir.c_str(), doomed.c_str()) != 0) {
    warnings.push_back("could not remove checkpoint " + dir + ": " + std::strerror(errno));
    return;
  }
  std::vector<std::string> files;
  for (const auto& [file, checksum] : state.files) files.push_back(file);
  files.emplace_back("state.json");
  remove_named_then_directory(doomed, files, warnings);
}

}  // namespace

std::vector<std::string> remove_checkpoint_temporary(const std::string& dir) {
  std::vector<std::string> warnings;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return warnings;
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(dir.c_str()) != 0) warnings.push_back("could not remove " + dir + ": " + std::strerror(errno));
    return warnings;
  }
  // What a checkpoint write puts there: its tensor files, state.json, and their temporaries (NAME.tmp.XXXXXX).
  std::vector<std::string> written = formats::checkpoint_tensor_files(/*ema=*/true);
  written.emplace_back("state.json");
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      for (const std::string& file : written)
        if (name == file || name.rfind(file + ".tmp.", 0) == 0) names.push_back(name);
    }
    ::closedir(d);
  }
  remove_named_then_directory(dir, names, warnings);
  return warnings;
}

std::string file_checksum(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  Xxh64 hash;
  std::vector<char> buffer(size_t{8} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      errno = err;
      fail_errno("cannot read", path);
    }
    if (n == 0) break;
    hash.update(buffer.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return format_checksum(hash.digest());
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  const std::string root = checkpoints_root(run_dir);
  std::vector<std::string> names;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return {};
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string dir = join_path(root, name);
    if (is_step_dir_name(name) && is_real_directory(dir) && path_exists(join_path(dir, "state.json")))
      names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());  // zero-padded step numbers sort as numbers
  for (auto& n : names) n = join_path(root, n);
  return names;
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  auto all = list_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string write_checkpoint(const std::string& run_dir, const torch::nn::Module& model,
                             const CheckpointContents& contents) {
  const std::string root = checkpoints_root(run_dir);
  make_directories(root);
  const int64_t step = contents.state.next_step;
  const std::string final_dir = join_path(root, step_dir_name(step));
  const std::string tmp_dir = join_path(root, "." + step_dir_name(step) + ".tmp");
  // A leftover of a crash mid-write: its files removed (a link there is removed, not followed), anything else kept.
  const std::vector<std::string> leftover = remove_checkpoint_temporary(tmp_dir);
  if (::mkdir(tmp_dir.c_str(), 0755) != 0)
    throw std::runtime_error("checkpoint: cannot create '" + tmp_dir + "': " + std::strerror(errno) +
                             (leftover.empty() ? std::string() : " (" + leftover.back() + ")"));

  formats::CheckpointState state = contents.state;
  state.optimizer_precision = contents.optimizer.precision;
  state.optimizer_scalars = contents.optimizer.scalars;
  state.ema = !contents.ema.empty();
  model::save_state_dict(model, join_path(tmp_dir, "model.safetensors"));
  model::write_safetensors(join_path(tmp_dir, "optimizer.safetensors"), contents.optimizer.tensors,
                           {{"precision", contents.optimizer.precision}});
  if (state.ema) model::write_safetensors(join_path(tmp_dir, "ema.safetensors"), contents.ema);
  state.files.clear();
  for (const std::string& name : formats::checkpoint_tensor_files(state.ema))
    state.files[name] = file_checksum(join_path(tmp_dir, name));  // just written: read from the page cache
  formats::write_file_atomic(join_path(tmp_dir, "state.json"),
                             formats::dump_json_file(formats::checkpoint_state_to_json(state)));
  fsync_path(tmp_dir, true);

  struct stat st {};
  if (::lstat(final_dir.c_str(), &st) == 0) {
    // The same step written again (a run interrupted right after it resumed): replace it only when it is ours.
    const auto existing = owned_state(final_dir, state.run_id);
    if (!existing)
      throw std::runtime_error("checkpoint: '" + final_dir + "' exists and was not written by this run; left alone");
    std::vector<std::string> warnings;
    remove_own_checkpoint(final_dir, *existing, warnings);
    if (path_exists(final_dir)) throw std::runtime_error("checkpoint: cannot replace '" + final_dir + "'");
  }
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) fail_errno("cannot rename to", final_dir);
  fsync_path(root, true);
  return final_dir;
}

std::vector<std::string> prune_checkpoints(const std::string& run_dir, const std::string& run_id, int keep_last) {
  if (keep_last < 1) throw std::invalid_argument("checkpoint: keep_last must be >= 1");
  std::vector<std::pair<std::string, formats::CheckpointState>> own;
  for (const std::string& dir : list_checkpoints(run_dir))
    if (auto state = owned_state(dir, run_id)) own.emplace_back(dir, std::move(*state));
  std::vector<std::string> warnings;
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < own.size(); ++i)
    remove_own_checkpoint(own[i].first, own[i].second, warnings);
  return warnings;
}

CheckpointContents read_checkpoint(const std::string& checkpoint_dir, torch::nn::Module& model,
                                   const formats::CheckpointExpectations& expected) {
  const std::string state_path = join_path(checkpoint_dir, "state.json");
  CheckpointContents out;
  out.state = formats::read_checkpoint_state(state_path);
  formats::check_checkpoint_state(out.state, state_path, expected);
  for (const auto& [name, checksum] : out.state.files) {
    const std::string path = join_path(checkpoint_dir, name);
    std::string actual;
    try {
      actual = file_checksum(path);
    } catch (const std::runtime_error& e) {
      throw formats::FormatError(path, "", std::string("unreadable: ") + e.what());
    }
    if (actual != checksum)
      throw formats::FormatError(path, "",
                                 "checksum " + actual + " differs from " + checksum + " in " + state_path +
                                     ": the file is damaged; resume from an older checkpoint by moving this one away");
  }
  out.optimizer.precision = out.state.optimizer_precision;
  out.optimizer.scalars = out.state.optimizer_scalars;
  model::load_state_dict(model, join_path(checkpoint_dir, "model.safetensors"), /*strict=*/true);
  auto opt = model::SafetensorsFile::open(join_path(checkpoint_dir, "optimizer.safetensors"));
  for (const auto& e : opt.entries()) out.optimizer.tensors.emplace_back(e.name, opt.tensor(e.name));
  if (out.state.ema) {
    auto ema = model::SafetensorsFile::open(join_path(checkpoint_dir, "ema.safetensors"));
    for (const auto& e : ema.entries()) out.ema.emplace_back(e.name, ema.tensor(e.name));
  }
  return out;
}

}  // namespace vlatune::trainer
