// Writes a LeRobot dataset with known contents (see lerobot_fixture.h), for tests and benchmarks.
//
//   make_lerobot_dataset --out DIR [--version v2.0|v2.1|v3.0] [--storage image|video] [--codec libsvtav1|libx264|
//       libx265] [--episodes N] [--length L] [--length-jitter J] [--width W] [--height H] [--fps F]
//       [--episodes-per-file K] [--seed S] [--cameras a,b] [--state-dim N] [--action-dim N] [--vector-layout
//       fixed|list] [--quiet-ffmpeg 0|1]
//
// Episode e has length L + (hash(seed, e) mod (2J + 1)) - J (at least 1). Prints the files written and the total
// size.
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include <libavutil/log.h>
}

#include "tests/lerobot_fixture/lerobot_fixture.h"

namespace {

using vlatune::testing::LeRobotFixture;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "make_lerobot_dataset: %s\n"
               "usage: make_lerobot_dataset --out DIR [--version v2.0|v2.1|v3.0] [--storage image|video]\n"
               "  [--codec libsvtav1|libx264|libx265] [--episodes N] [--length L] [--length-jitter J]\n"
               "  [--width W] [--height H] [--fps F] [--episodes-per-file K] [--seed S] [--cameras a,b]\n"
               "  [--state-dim N] [--action-dim N] [--vector-layout fixed|list] [--quiet-ffmpeg 0|1]\n",
               why.c_str());
  std::exit(2);
}

int64_t to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno) usage("bad integer for " + flag + ": " + v);
  return x;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Every regular file under `dir` (relative paths), sorted, with sizes.
void list_files(const std::string& dir, const std::string& rel, std::vector<std::pair<std::string, int64_t>>* out) {
  DIR* d = opendir((dir + "/" + rel).c_str());
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string r = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (stat((dir + "/" + r).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      list_files(dir, r, out);
    } else if (S_ISREG(st.st_mode)) {
      out->emplace_back(r, static_cast<int64_t>(st.st_size));
    }
  }
  closedir(d);
}

}  // namespace

int main(int argc, char** argv) {
  LeRobotFixture f;
  int64_t episodes = 2, length = 10, jitter = 0;
  bool quiet = true;
  bool have_out = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage("help");
    if (i + 1 >= argc) usage("missing value for " + flag);
    const std::string v = argv[++i];
    if (flag == "--out") {
      f.dir = v;
      have_out = true;
    } else if (flag == "--version") {
      f.version = v;
    } else if (flag == "--storage") {
      f.storage = v;
    } else if (flag == "--codec") {
      f.codec = v;
    } else if (flag == "--episodes") {
      episodes = to_int(flag, v);
    } else if (flag == "--length") {
      length = to_int(flag, v);
    } else if (flag == "--length-jitter") {
      jitter = to_int(flag, v);
    } else if (flag == "--width") {
      f.width = to_int(flag, v);
    } else if (flag == "--height") {
      f.height = to_int(flag, v);
    } else if (flag == "--fps") {
      f.fps = to_int(flag, v);
    } else if (flag == "--episodes-per-file") {
      f.episodes_per_file = to_int(flag, v);
    } else if (flag == "--seed") {
      f.seed = static_cast<uint64_t>(to_int(flag, v));
    } else if (flag == "--state-dim") {
      f.state_dim = to_int(flag, v);
    } else if (flag == "--action-dim") {
      f.action_dim = to_int(flag, v);
    } else if (flag == "--vector-layout") {
      f.vector_layout = v;
    } else if (flag == "--quiet-ffmpeg") {
      quiet = to_int(flag, v) != 0;
    } else if (flag == "--cameras") {
      f.cameras.clear();
      size_t start = 0;
      while (start <= v.size()) {
        const size_t comma = v.find(',', start);
        const std::string name = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (name.empty()) usage("empty camera name in --cameras");
        f.cameras.push_back(name);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (!have_out) usage("--out is required");
  if (episodes < 1) usage("--episodes must be >= 1");
  if (length < 1 || jitter < 0) usage("--length must be >= 1 and --length-jitter >= 0");
  f.episode_lengths.clear();
  for (int64_t e = 0; e < episodes; ++e) {
    const int64_t delta =
        jitter ? static_cast<int64_t>(mix64(f.seed * 1000003ULL + static_cast<uint64_t>(e)) % (2 * jitter + 1)) - jitter
               : 0;
    f.episode_lengths.push_back(std::max<int64_t>(1, length + delta));
  }
  if (quiet) {
    av_log_set_level(AV_LOG_ERROR);
    setenv("SVT_LOG", "1", 0);  // SVT-AV1: errors only
  }

  const auto t0 = std::chrono::steady_clock::now();
  try {
    vlatune::testing::write_lerobot_fixture(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_lerobot_dataset: %s\n", e.what());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t frames = 0;
  for (int64_t len : f.episode_lengths) frames += len;
  std::vector<std::pair<std::string, int64_t>> files;
  list_files(f.dir, "", &files);
  std::sort(files.begin(), files.end());
  int64_t total = 0;
  for (const auto& [name, size] : files) {
    std::printf("%12lld  %s\n", static_cast<long long>(size), name.c_str());
    total += size;
  }
  std::printf(
      "wrote %s: LeRobot %s, %s storage%s%s, %lld episodes, %lld frames, %zu cameras %lldx%lld, fps %lld\n"
      "total %lld bytes in %zu files (%.1f bytes/frame); %.2f s, %.1f frames/s\n",
      f.dir.c_str(), f.version.c_str(), f.storage.c_str(), f.storage == "video" ? " codec " : "",
      f.storage == "video" ? f.codec.c_str() : "", static_cast<long long>(episodes), static_cast<long long>(frames),
      f.cameras.size(), static_cast<long long>(f.width), static_cast<long long>(f.height),
      static_cast<long long>(f.fps), static_cast<long long>(total), files.size(),
      static_cast<double>(total) / static_cast<double>(frames), secs, static_cast<double>(frames) / secs);
  return 0;
}
