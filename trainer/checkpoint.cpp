#include "trainer/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "model/safetensors_io.h"
#include "model/state_dict.h"
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

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail_errno("cannot open", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) fail_errno("cannot fsync", path);  // EINVAL: fs without directory fsync
}

// Removes a directory that holds only files (a checkpoint).
void remove_flat_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return;
    fail_errno("cannot open", dir);
  }
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = join_path(dir, name);
    if (::unlink(path.c_str()) != 0) {
      ::closedir(d);
      fail_errno("cannot remove", path);
    }
  }
  ::closedir(d);
  if (::rmdir(dir.c_str()) != 0) fail_errno("cannot remove", dir);
}

void write_text_durable(const std::string& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) fail_errno("cannot write", path);
    f << text;
    if (!f.flush()) fail_errno("cannot write", path);
  }
  fsync_path(path, false);
}

std::string checkpoints_root(const std::string& run_dir) {
  return join_path(run_dir, "checkpoints");
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  const std::string root = checkpoints_root(run_dir);
  std::vector<std::string> names;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return {};
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) == 0 && path_exists(join_path(join_path(root, name), "state.json")))
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
                             const CheckpointContents& contents, int keep_last) {
  if (keep_last < 1) throw std::invalid_argument("checkpoint: keep_last must be >= 1");
  const std::string root = checkpoints_root(run_dir);
  make_directories(root);
  const std::string final_dir = join_path(root, step_dir_name(contents.next_step));
  const std::string tmp_dir = join_path(root, "." + step_dir_name(contents.next_step) + ".tmp");
  remove_flat_dir(tmp_dir);  // a leftover of a crash mid-write
  if (::mkdir(tmp_dir.c_str(), 0755) != 0) fail_errno("cannot create", tmp_dir);

  model::save_state_dict(model, join_path(tmp_dir, "model.safetensors"));
  model::write_safetensors(join_path(tmp_dir, "optimizer.safetensors"), contents.optimizer.tensors,
                           {{"precision", contents.optimizer.precision}});
  if (!contents.ema.empty()) model::write_safetensors(join_path(tmp_dir, "ema.safetensors"), contents.ema);

  nlohmann::json state = {
      {"schema", kCheckpointSchema},
      {"next_step", contents.next_step},
      {"optimizer", {{"precision", contents.optimizer.precision}, {"scalars", contents.optimizer.scalars}}},
      {"ema", !contents.ema.empty()},
      {"trainer", contents.trainer_state}};
  write_text_durable(join_path(tmp_dir, "state.json"), state.dump(2) + "\n");
  fsync_path(tmp_dir, true);

  remove_flat_dir(final_dir);  // the same step written again (e.g. a final checkpoint after resume)
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) fail_errno("cannot rename to", final_dir);
  fsync_path(root, true);

  auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) remove_flat_dir(all[i]);
  return final_dir;
}

CheckpointContents read_checkpoint(const std::string& checkpoint_dir, torch::nn::Module& model) {
  const std::string state_path = join_path(checkpoint_dir, "state.json");
  std::ifstream f(state_path);
  if (!f) throw std::runtime_error("checkpoint: cannot read '" + state_path + "'");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint: '" + state_path + "' is not JSON: " + e.what());
  }
  auto require = [&](const char* key) -> const nlohmann::json& {
    if (!state.is_object() || !state.contains(key))
      throw std::runtime_error("checkpoint: '" + state_path + "': $." + key + " missing");
    return state.at(key);
  };
  if (require("schema") != kCheckpointSchema)
    throw std::runtime_error("checkpoint: '" + state_path + "': $.schema: expected '" + kCheckpointSchema + "', got " +
                             require("schema").dump());
  CheckpointContents out;
  try {
    out.next_step = require("next_step").get<int64_t>();
    out.optimizer.precision = require("optimizer").at("precision").get<std::string>();
    out.optimizer.scalars = require("optimizer").at("scalars").get<std::map<std::string, double>>();
    out.trainer_state = require("trainer");
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("checkpoint: '" + state_path + "': " + e.what());
  }

  model::load_state_dict(model, join_path(checkpoint_dir, "model.safetensors"), /*strict=*/true);
  auto opt = model::SafetensorsFile::open(join_path(checkpoint_dir, "optimizer.safetensors"));
  for (const auto& e : opt.entries()) out.optimizer.tensors.emplace_back(e.name, opt.tensor(e.name));
  if (require("ema").get<bool>()) {
    auto ema = model::SafetensorsFile::open(join_path(checkpoint_dir, "ema.safetensors"));
    for (const auto& e : ema.entries()) out.ema.emplace_back(e.name, ema.tensor(e.name));
  }
  return out;
}

}  // namespace vlatune::trainer
