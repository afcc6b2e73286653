#include "trainer/lerobot_import.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "formats/json_io.h"
#include "trainer/file_util.h"
#include "trainer/image_resize.h"
#include "trainer/lerobot_dataset.h"
#include "trainer/libero_import.h"
#include "trainer/media_decode.h"
#include "trainer/parquet_table.h"
#include "trainer/tokenizer.h"

namespace vlatune::trainer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// openpi's slot names, in slot order: the first camera is the base view, the others wrists.
const char* const kSlotNames[] = {"base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"};
constexpr int64_t kMaxCameras = 3;

// One episode to import: its source, its position in that source, and where its records go.
struct Job {
  size_t source = 0;
  size_t episode = 0;  // index into the source's episodes
  int64_t global = 0;  // the episode's number across all sources
  bool val = false;
};

struct EpisodeData {
  LeRobotFrames frames;  // normalized state/actions after pass 1
};

// One episode's records, built by a worker and written by the main thread in job order.
struct EpisodeRecords {
  int64_t frames = 0;
  std::vector<uint8_t> images;  // [frames][cameras][side][side][3]
  std::vector<int32_t> tokens;  // [frames][text_len]
  std::vector<int32_t> lengths;
  std::vector<float> actions;  // [frames][horizon][action_dim], normalized
  std::vector<float> state;    // [frames][state_dim], normalized
  int64_t truncated = 0;
};

std::string pick_key(const LeRobotDataset& d, const std::string& given, std::initializer_list<const char*> defaults,
                     const char* what, const char* flag) {
  if (!given.empty()) {
    if (d.feature(given) == nullptr)
      throw std::invalid_argument(std::string(flag) + " " + given + ": no such feature in " + d.dir +
                                  "/meta/info.json (features: " + d.feature_list() + ")");
    return given;
  }
  for (const char* k : defaults)
    if (d.feature(k) != nullptr) return k;
  std::string tried;
  for (const char* k : defaults) tried += (tried.empty() ? "" : ", ") + std::string(k);
  throw std::invalid_argument(std::string("no ") + what + " feature (tried " + tried + ") in " + d.dir +
                              "/meta/info.json; name it with " + flag + " (features: " + d.feature_list() + ")");
}

// Tokenized prompts by task string (the plain prompt is the same for every frame of a task).
class PromptCache {
 public:
  PromptCache(const PromptTokenizer& tokenizer) : tokenizer_(tokenizer) {}
  TokenizedPrompt get(const std::string& task) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(task);
    if (it == cache_.end()) it = cache_.emplace(task, tokenizer_.tokenize(task)).first;
    return it->second;
  }

 private:
  const PromptTokenizer& tokenizer_;
  std::mutex mutex_;
  std::map<std::string, TokenizedPrompt> cache_;
};

class Progress {
 public:
  Progress(std::ostream* log, bool bar, int64_t total) : log_(log), bar_(bar), total_(total), t0_(Clock::now()) {}

  void update(int64_t done, bool final = false) {
    if (log_ == nullptr) return;
    const double s = seconds_since(t0_);
    if (!final && s - last_ < (bar_ ? 0.25 : 5.0)) return;
    last_ = s;
    const double rate = s > 0 ? static_cast<double>(done) / s : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
    char line[160];
    std::snprintf(line, sizeof(line), "import: %lld/%lld frames (%.0f%%), %.0f frames/s, %s %.0f s",
                  static_cast<long long>(done), static_cast<long long>(total_),
                  total_ > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0, rate,
                  final ? "took" : "ETA", final ? s : eta);
    if (bar_)
      *log_ << "\r" << line << (final ? "\n" : "") << std::flush;
    else
      *log_ << line << "\n" << std::flush;
  }

 private:
  std::ostream* log_;
  bool bar_;
  int64_t total_;
  Clock::time_point t0_;
  double last_ = -1e9;
};

std::string partial_dir(const std::string& out) {
  std::string o = out;
  while (o.size() > 1 && o.back() == '/') o.pop_back();
  return o + ".partial-import";
}

}  // namespace

bool lerobot_import_available() {
  return lerobot_import_missing().empty();
}

std::string lerobot_import_missing() {
  std::vector<std::string> missing;
  if (!ParquetTable::available()) missing.push_back("Arrow/Parquet (pip install pyarrow into the torch venv)");
  if (!media_decode_available()) missing.push_back("FFmpeg (libavformat-dev libavcodec-dev libswscale-dev)");
  if (!PromptTokenizer::available()) missing.push_back("SentencePiece (libsentencepiece-dev)");
  std::string s;
  for (const auto& m : missing) s += (s.empty() ? "" : " and ") + m;
  return s;
}

std::vector<int64_t> parse_episode_selection(const std::string& spec, int64_t count, const std::string& flag) {
  std::set<int64_t> picked;
  auto number = [&](const std::string& text, int64_t fallback) -> int64_t {
    if (text.empty()) return fallback;
    if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 12)
      throw std::invalid_argument(flag + " " + spec + ": '" + text + "' is not an episode number");
    return std::stoll(text);
  };
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.empty()) throw std::invalid_argument(flag + " " + spec + ": empty item");
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      const int64_t i = number(item, 0);
      if (i >= count)
        throw std::invalid_argument(flag + " " + spec + ": episode " + std::to_string(i) + " does not exist (" +
                                    std::to_string(count) + " episodes: 0.." + std::to_string(count - 1) + ")");
      picked.insert(i);
    } else {
      const int64_t a = number(item.substr(0, colon), 0), b = number(item.substr(colon + 1), count);
      if (a >= b || b > count)
        throw std::invalid_argument(flag + " " + spec + ": range " + item + " is empty or past the " +
                                    std::to_string(count) + " episodes");
      for (int64_t i = a; i < b; ++i) picked.insert(i);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return {picked.begin(), picked.end()};
}

std::vector<int64_t> chunk_weights(int64_t frames, int64_t horizon) {
  std::vector<int64_t> w(static_cast<size_t>(frames), 0);
  for (int64_t t = 0; t < frames; ++t)
    for (int64_t k = 0; k < horizon; ++k) ++w[static_cast<size_t>(std::min(t + k, frames - 1))];
  return w;
}

LeRobotImportReport import_lerobot(const LeRobotImportOptions& o) {
  if (!lerobot_import_available())
    throw std::runtime_error("LeRobot import is unavailable in this build: vlatune was built without " +
                             lerobot_import_missing() + "; install it and reconfigure");
  if (o.sources.empty()) throw std::invalid_argument("import: no --lerobot dataset given");
  if (o.horizon < 1 || o.horizon > 4096) throw std::invalid_argument("--horizon must be in [1, 4096]");
  if (o.image_side < 1 || o.image_side > 4096) throw std::invalid_argument("--image-side must be in [1, 4096]");
  if (!(o.tolerance_s > 0) || !std::isfinite(o.tolerance_s) || o.tolerance_s > 1.0)
    throw std::invalid_argument("--tolerance must be in (0, 1] seconds");
  if (!is_fresh_output(o.out))
    throw std::invalid_argument("--out " + o.out +
                                ": exists and is not an empty directory (choose a new dataset directory)");
  auto log = [&](const std::string& line) {
    if (o.log != nullptr) *o.log << line << "\n" << std::flush;
  };
  const auto t0 = Clock::now();
  LeRobotImportReport report;

  // Metadata of every source; the first decides the features, the others must match it.
  std::vector<LeRobotDataset> sources;
  for (const auto& dir : o.sources) sources.push_back(read_lerobot_dataset(dir));
  const LeRobotDataset& first = sources.front();
  report.version = first.version;
  report.state_key = pick_key(first, o.state_key, {"observation.state", "state"}, "state", "--state");
  report.action_key = pick_key(first, o.action_key, {"action", "actions"}, "action", "--action");
  if (o.cameras.empty()) {
    for (const auto& f : first.features)
      if (f.is_camera()) report.camera_keys.push_back(f.key);
    if (report.camera_keys.empty())
      throw std::invalid_argument(
          first.dir + "/meta/info.json has no image or video features (features: " + first.feature_list() + ")");
  } else {
    for (const auto& key : o.cameras) {
      const LeRobotFeature* f = first.feature(key);
      if (f == nullptr || !f->is_camera())
        throw std::invalid_argument("--camera " + key + ": " +
                                    (f == nullptr ? "no such feature" : "not an image/video feature") + " in " +
                                    first.dir + "/meta/info.json (features: " + first.feature_list() + ")");
      report.camera_keys.push_back(key);
    }
  }
  if (static_cast<int64_t>(report.camera_keys.size()) > kMaxCameras)
    throw std::invalid_argument(std::to_string(report.camera_keys.size()) + " cameras (" + first.feature_list() +
                                "), but Pi0.5 has " + std::to_string(kMaxCameras) +
                                " image slots: choose them with --camera KEY (in slot order)");
  const LeRobotFeature& state_f = *first.feature(report.state_key);
  const LeRobotFeature& action_f = *first.feature(report.action_key);
  for (const auto* f : {&state_f, &action_f})
    if (f->is_camera() || (f->dtype != "float32" && f->dtype != "float64"))
      throw std::invalid_argument(first.dir + "/meta/info.json: feature " + f->key + " is " + f->dtype +
                                  ", expected float32 or float64");
  const int64_t state_dim = state_f.width_of_vector(), action_dim = action_f.width_of_vector();
  if (action_dim < 1 || action_dim > kPaddedActionDim)
    throw std::invalid_argument(report.action_key + " has " + std::to_string(action_dim) + " dims; Pi0.5 takes 1.." +
                                std::to_string(kPaddedActionDim));
  for (size_t s = 1; s < sources.size(); ++s) {
    const LeRobotDataset& d = sources[s];
    auto same = [&](const std::string& key) {
      const LeRobotFeature* a = first.feature(key);
      const LeRobotFeature* b = d.feature(key);
      if (b == nullptr || b->dtype != a->dtype || b->shape != a->shape)
        throw DataError(d.dir + "/meta/info.json: feature " + key + " " +
                        (b == nullptr ? std::string("is missing") : "is " + b->dtype + " of another shape") +
                        ", unlike " + first.dir + " (sources must have matching features)");
    };
    for (const auto& key : report.camera_keys) same(key);
    same(report.state_key);
    same(report.action_key);
    if (std::abs(d.fps - first.fps) > 1e-9)
      throw DataError(d.dir + "/meta/info.json: fps " + std::to_string(d.fps) + ", but " + first.dir + " has " +
                      std::to_string(first.fps) + " (fps that disagree)");
  }
  std::string choice =
      "import: " + std::to_string(sources.size()) + " LeRobot source(s), " + first.version + "; cameras (slot order):";
  for (size_t c = 0; c < report.camera_keys.size(); ++c)
    choice += std::string(c ? "," : "") + " " + report.camera_keys[c] + " -> " + kSlotNames[c] + " (" +
              first.feature(report.camera_keys[c])->dtype + ")";
  log(choice + "; state " + report.state_key + " [" + std::to_string(state_dim) + "]; actions " + report.action_key +
      " [" + std::to_string(action_dim) + "]; horizon " + std::to_string(o.horizon) + "; images " +
      std::to_string(o.image_side) + " px");

  // Episode selection and the validation split.
  int64_t total_episodes = 0;
  for (const auto& d : sources) total_episodes += static_cast<int64_t>(d.episodes.size());
  const auto selected = o.episodes.empty() ? parse_episode_selection("0:", total_episodes, "--episodes")
                                           : parse_episode_selection(o.episodes, total_episodes, "--episodes");
  std::set<int64_t> val;
  if (!o.val_episodes.empty()) {
    if (o.val_episodes.find_first_not_of("0123456789") == std::string::npos) {
      const int64_t n = std::stoll(o.val_episodes.substr(0, 12));
      if (n < 1 || n >= static_cast<int64_t>(selected.size()))
        throw std::invalid_argument("--val-episodes " + o.val_episodes + ": need 1.." +
                                    std::to_string(static_cast<int64_t>(selected.size()) - 1) + " of the " +
                                    std::to_string(selected.size()) +
                                    " selected episodes (some must stay for training)");
      val.insert(selected.end() - n, selected.end());
    } else {
      for (int64_t e : parse_episode_selection(o.val_episodes, total_episodes, "--val-episodes")) {
        if (!std::binary_search(selected.begin(), selected.end(), e))
          throw std::invalid_argument("--val-episodes: episode " + std::to_string(e) + " is not among --episodes");
        val.insert(e);
      }
      if (val.size() == selected.size())
        throw std::invalid_argument("--val-episodes: every selected episode would be held out");
    }
  }
  std::vector<Job> jobs;
  {
    std::vector<Job> val_jobs;
    int64_t global = 0;
    for (size_t s = 0; s < sources.size(); ++s)
      for (size_t e = 0; e < sources[s].episodes.size(); ++e, ++global) {
        if (!std::binary_search(selected.begin(), selected.end(), global)) continue;
        Job j{s, e, global, val.count(global) > 0};
        (j.val ? val_jobs : jobs).push_back(j);
      }
    jobs.insert(jobs.end(), val_jobs.begin(), val_jobs.end());  // train first, then val: one writer at a time
  }

  // Pass 1: the frame columns (no images) of every job, grouped by data file so each file is read once.
  std::vector<EpisodeData> data(jobs.size());
  {
    std::map<std::pair<size_t, std::string>, std::vector<size_t> > by_file;  // (source, file) -> job positions
    for (size_t j = 0; j < jobs.size(); ++j)
      by_file[{jobs[j].source, sources[jobs[j].source].episodes[jobs[j].episode].data_file}].push_back(j);
    for (const auto& [key, positions] : by_file) {
      std::vector<size_t> episodes;
      for (size_t j : positions) episodes.push_back(jobs[j].episode);
      auto frames = read_lerobot_frames(sources[key.first], key.second, episodes, report.state_key, state_dim,
                                        report.action_key, action_dim, o.tolerance_s);
      for (size_t j : positions) data[j].frames = std::move(frames.at(jobs[j].episode));
    }
  }
  // Norm stats over the training episodes.
  NormStats norm;
  {
    std::vector<float> states, actions;
    std::vector<int64_t> weights;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].val) continue;
      const auto& f = data[j].frames;
      states.insert(states.end(), f.state.begin(), f.state.end());
      actions.insert(actions.end(), f.actions.begin(), f.actions.end());
      const auto w = chunk_weights(static_cast<int64_t>(f.timestamps.size()), o.horizon);
      weights.insert(weights.end(), w.begin(), w.end());
    }
    norm.actions = compute_norm_stats(actions, action_dim, weights);
    if (state_dim > 0) norm.state = compute_norm_stats(states, state_dim, {});
  }
  for (auto& d : data) {
    auto& f = d.frames;
    const auto rows = static_cast<int64_t>(f.timestamps.size());
    normalize_quantile(f.actions.data(), rows, action_dim, norm.actions);
    if (state_dim > 0) normalize_quantile(f.state.data(), rows, state_dim, norm.state);
  }
  int64_t train_frames = 0, val_frames = 0;
  for (size_t j = 0; j < jobs.size(); ++j)
    (jobs[j].val ? val_frames : train_frames) += static_cast<int64_t>(data[j].frames.timestamps.size());
  report.stats_seconds = seconds_since(t0);
  report.episodes = static_cast<int64_t>(jobs.size()) - static_cast<int64_t>(val.size());
  report.val_episodes = static_cast<int64_t>(val.size());
  report.frames = train_frames;
  report.val_frames = val_frames;
  log("import: " + std::to_string(report.episodes) + " training episodes (" + std::to_string(train_frames) +
      " frames)" +
      (val.empty() ? std::string()
                   : ", " + std::to_string(val.size()) + " held out (" + std::to_string(val_frames) + " frames)") +
      "; norm stats from the tables in " + std::to_string(report.stats_seconds).substr(0, 5) + " s");

  // Pass 2: decode, resize, tokenize and write, episodes in parallel, records in order.
  const PromptTokenizer tokenizer(o.tokenizer_model, o.text_len);
  PromptCache prompts(tokenizer);
  const auto cameras = static_cast<int64_t>(report.camera_keys.size());
  const int64_t side = o.image_side, frame_bytes = side * side * 3;

  const std::string partial = partial_dir(o.out);
  remove_tree(partial);  // a killed import's leftovers: this import starts clean
  DatasetManifest manifest;
  manifest.layout = RecordLayout{cameras, side, o.text_len, o.horizon, action_dim, state_dim};
  for (int64_t c = 0; c < cameras; ++c) manifest.cameras.push_back(kSlotNames[c]);
  manifest.tokenizer = {"sentencepiece", o.tokenizer_model, tokenizer.vocab_size(), tokenizer.bos_id(),
                        o.discrete_state};
  manifest.norm = norm;
  nlohmann::json camera_map = nlohmann::json::object();
  for (int64_t c = 0; c < cameras; ++c) camera_map[kSlotNames[c]] = report.camera_keys[static_cast<size_t>(c)];
  nlohmann::json dirs = nlohmann::json::array();
  for (const auto& d : sources) dirs.push_back(d.dir);
  manifest.source = {{"kind", "lerobot"},
                     {"version", first.version},
                     {"dirs", dirs},
                     {"fps", first.fps},
                     {"cameras", camera_map},
                     {"state", report.state_key},
                     {"actions", report.action_key},
                     {"episodes", o.episodes.empty() ? "all" : o.episodes},
                     {"val_episodes", o.val_episodes},
                     {"images", "openpi resize_with_pad to " + std::to_string(side) + " (PIL bilinear)"},
                     {"video_tolerance_s", o.tolerance_s},
                     {"chunk_padding", "last action repeated past the episode end"},
                     {"norm_stats", "training episodes; actions as they appear in the chunks"}};
  nlohmann::json val_source = manifest.source;
  val_source["split"] = "val";
  manifest.source["split"] = "train";
  std::unique_ptr<DatasetWriter> train_writer =
      std::make_unique<DatasetWriter>(partial, manifest, train_frames, o.shard_bytes);
  std::unique_ptr<DatasetWriter> val_writer;
  if (!val.empty()) {
    DatasetManifest vm = manifest;
    vm.source = val_source;
    val_writer = std::make_unique<DatasetWriter>(join_path(partial, "val"), vm, val_frames, o.shard_bytes);
  }

  const int64_t hw = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t workers = std::min<int64_t>(o.workers > 0 ? o.workers : hw, static_cast<int64_t>(jobs.size()));
  const size_t max_ahead = static_cast<size_t>(2 * workers + 2);  // episodes decoded but not yet written
  std::mutex mutex;
  std::condition_variable cv;
  std::map<size_t, EpisodeRecords> done;
  size_t next_job = 0, written = 0;
  bool abort = false;
  std::exception_ptr error;

  auto build = [&](size_t j, std::map<std::string, std::unique_ptr<VideoReader> >& videos,
                   std::map<std::string, std::unique_ptr<ParquetTable> >& tables) {
    const Job& job = jobs[j];
    const LeRobotDataset& d = sources[job.source];
    const LeRobotEpisode& e = d.episodes[job.episode];
    const LeRobotFrames& f = data[j].frames;
    const auto n = static_cast<int64_t>(f.timestamps.size());
    EpisodeRecords r;
    r.frames = n;
    r.images.resize(static_cast<size_t>(n * cameras * frame_bytes));
    const std::string episode_name = d.dir + " episode " + std::to_string(e.index);
    for (int64_t c = 0; c < cameras; ++c) {
      const std::string& key = report.camera_keys[static_cast<size_t>(c)];
      const LeRobotFeature& feature = *d.feature(key);
      auto store = [&](int64_t t, const RgbImage& img, const std::string& where) {
        if (img.height != feature.height || img.width != feature.width)
          throw DataError(where + ": " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                          " pixels, but meta/info.json gives " + key + " as " + std::to_string(feature.width) + "x" +
                          std::to_string(feature.height));
        resize_with_pad(img.pixels.data(), img.height, img.width, side,
                        r.images.data() + (t * cameras + c) * frame_bytes);
      };
      if (feature.dtype == "image") {
        auto& table = tables[e.data_file];
        if (!table) table = std::make_unique<ParquetTable>(e.data_file);
        const auto cells = table->image_cells(key, f.first_row, n);
        for (int64_t t = 0; t < n; ++t) {
          const std::string where =
              e.data_file + ": column '" + key + "', " + episode_name + ", frame " + std::to_string(t);
          const auto& cell = cells[static_cast<size_t>(t)];
          try {
            if (!cell.bytes.empty()) {
              store(t, decode_image(reinterpret_cast<const uint8_t*>(cell.bytes.data()), cell.bytes.size()), where);
            } else {
              const std::string file = cell.path.front() == '/' ? cell.path : join_path(d.dir, cell.path);
              std::string bytes;
              try {
                bytes = formats::read_text_file(file);
              } catch (const std::exception&) {
                throw DataError("its image file " + file + " is missing or unreadable");
              }
              store(t, decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), where);
            }
          } catch (const DataError& err) {
            const std::string what = err.what();
            if (what.rfind(where, 0) == 0) throw;
            throw DataError(where + ": " + what);
          }
        }
      } else {
        const LeRobotVideoSpan& span = e.videos.at(key);
        auto& reader = videos[span.file];
        if (!reader) {
          reader = std::make_unique<VideoReader>(span.file);
          if (std::abs(reader->fps() - d.fps) > 0.01 * d.fps)
            throw DataError(span.file + ": the video runs at " + std::to_string(reader->fps()) +
                            " fps, but meta/info.json says " + std::to_string(d.fps) + " (fps that disagree)");
        }
        std::vector<double> times(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t)
          times[static_cast<size_t>(t)] = span.from_timestamp + f.timestamps[static_cast<size_t>(t)];
        std::vector<RgbImage> frames;
        reader->frames_at(times, o.tolerance_s, frames, [&](size_t t) {
          return episode_name + ", frame " + std::to_string(t) + " (timestamp " + std::to_string(f.timestamps[t]) +
                 " s)";
        });
        for (int64_t t = 0; t < n; ++t)
          store(t, frames[static_cast<size_t>(t)], span.file + ": " + episode_name + ", frame " + std::to_string(t));
      }
    }
    r.tokens.resize(static_cast<size_t>(n * o.text_len));
    r.lengths.resize(static_cast<size_t>(n));
    r.actions.resize(static_cast<size_t>(n * o.horizon * action_dim));
    for (int64_t t = 0; t < n; ++t) {
      const std::string& task = d.tasks.at(f.task_index[static_cast<size_t>(t)]);
      const TokenizedPrompt p =
          o.discrete_state ? tokenizer.tokenize(task, f.state.data() + t * state_dim, state_dim) : prompts.get(task);
      if (p.truncated) ++r.truncated;
      std::copy(p.ids.begin(), p.ids.end(), r.tokens.begin() + t * o.text_len);
      r.lengths[static_cast<size_t>(t)] = p.length;
      chunk_actions(f.actions.data(), n, action_dim, t, o.horizon, r.actions.data() + t * o.horizon * action_dim);
    }
    r.state = f.state;
    return r;
  };

  auto worker = [&]() {
    std::map<std::string, std::unique_ptr<VideoReader> > videos;
    std::map<std::string, std::unique_ptr<ParquetTable> > tables;
    for (;;) {
      size_t j;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return abort || next_job >= jobs.size() || next_job < written + max_ahead; });
        if (abort || next_job >= jobs.size()) return;
        j = next_job++;
      }
      // Readers of files this worker will not see again are closed (v3.0 files hold many episodes in order).
      if (videos.size() > 8) videos.clear();
      if (tables.size() > 4) tables.clear();
      try {
        EpisodeRecords r = build(j, videos, tables);
        std::lock_guard<std::mutex> lock(mutex);
        done.emplace(j, std::move(r));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        abort = true;
      }
      cv.notify_all();
    }
  };

  const auto t1 = Clock::now();
  Progress progress(o.log, o.progress_bar, train_frames + val_frames);
  int64_t frames_written = 0;
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) threads.emplace_back(worker);
  try {
    while (written < jobs.size()) {
      EpisodeRecords r;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return abort || done.count(written) > 0; });
        if (abort) break;
        r = std::move(done.at(written));
        done.erase(written);
      }
      DatasetWriter& writer = jobs[written].val ? *val_writer : *train_writer;
      SampleView view;
      view.images.resize(static_cast<size_t>(cameras));
      for (int64_t t = 0; t < r.frames; ++t) {
        for (int64_t c = 0; c < cameras; ++c)
          view.images[static_cast<size_t>(c)] = r.images.data() + (t * cameras + c) * frame_bytes;
        view.tokens = r.tokens.data() + t * o.text_len;
        view.token_len = r.lengths[static_cast<size_t>(t)];
        view.actions = r.actions.data() + t * o.horizon * action_dim;
        view.state = r.state.data() + t * state_dim;
        writer.append(view);
      }
      report.truncated_prompts += r.truncated;
      frames_written += r.frames;
      progress.update(frames_written);
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++written;
      }
      cv.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
      abort = true;
    }
    cv.notify_all();
  }
  for (auto& t : threads) t.join();
  if (error) {
    train_writer.reset();
    val_writer.reset();
    try {
      remove_tree(partial);
    } catch (const std::exception& e) {
      log(std::string("warning: ") + e.what());
    }
    std::rethrow_exception(error);
  }
  report.train = train_writer->finish();
  if (val_writer) report.val = val_writer->finish();
  // openpi's norm_stats.json beside the manifest, for tools that read openpi's assets.
  formats::write_file_atomic(join_path(partial, "norm_stats.json"), norm_stats_file_json(norm).dump(2) + "\n");
  if (path_exists(o.out) && ::rmdir(o.out.c_str()) != 0)  // an empty directory (checked at the start)
    throw std::runtime_error("cannot replace the empty directory " + o.out + ": " + std::strerror(errno));
  if (::rename(partial.c_str(), o.out.c_str()) != 0)
    throw std::runtime_error("cannot rename " + partial + " to " + o.out + ": " + std::strerror(errno));
  report.decode_seconds = seconds_since(t1);
  progress.update(frames_written, true);
  if (report.truncated_prompts > 0)
    log("warning: " + std::to_string(report.truncated_prompts) + " prompt(s) truncated to " +
        std::to_string(o.text_len) + " tokens");
  return report;
}

}  // namespace vlatune::trainer
