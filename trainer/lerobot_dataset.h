// A LeRobot dataset on disk (format v2.0, v2.1 or v3.0, as huggingface/lerobot writes them), read as metadata
// plus per-episode frame columns. Images and videos are decoded by the importer (trainer/lerobot_import.h).
//
//   v2.0 / v2.1                                          v3.0
//   meta/info.json                                       meta/info.json
//   meta/episodes.jsonl   {episode_index, tasks, length} meta/episodes/chunk-*/file-*.parquet (one row an episode:
//   meta/tasks.jsonl      {task_index, task}               length, tasks, data/{chunk,file}_index,
//   (v2.1: meta/episodes_stats.jsonl)                      dataset_{from,to}_index, videos/<key>/{chunk_index,
//   data/chunk-{episode_chunk:03d}/                        file_index, from_timestamp, to_timestamp})
//        episode_{episode_index:06d}.parquet             meta/tasks.parquet (task, task_index)
//   videos/chunk-{episode_chunk:03d}/{video_key}/        data/chunk-*/file-*.parquet (many episodes a file)
//        episode_{episode_index:06d}.mp4                 videos/{video_key}/chunk-*/file-*.mp4 (many a file)
// (the exact paths are info.json's data_path and video_path templates). Frame tables hold timestamp,
// frame_index, episode_index, index, task_index and one column per non-video feature; image features are
// struct<bytes, path> cells (PNG/JPEG), video features live in the MP4 files, addressed by timestamp.
//
// Every reader validates: a missing or malformed file, key or column is a DataError naming the file and the JSON
// path, column, episode or row.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/data_error.h"

namespace vlatune::trainer {

struct LeRobotFeature {
  std::string key;
  std::string dtype;              // "image", "video", "float32", "int64", ...
  std::vector<int64_t> shape;     // as info.json gives it
  int64_t height = 0, width = 0;  // image/video features: from shape and names
  double video_fps = 0;           // video features: info["video.fps"] when present (0 otherwise)
  bool is_camera() const { return dtype == "image" || dtype == "video"; }
  int64_t width_of_vector() const;  // numeric features: the product of the shape
};

// Where one episode's video frames are: file and the episode's start inside it (v3.0: many episodes a file).
struct LeRobotVideoSpan {
  std::string file;
  double from_timestamp = 0;
  double to_timestamp = 0;  // 0 where the format does not say (v2.x)
};

struct LeRobotEpisode {
  int64_t index = 0;  // episode_index
  int64_t length = 0;
  std::vector<std::string> tasks;
  std::string data_file;    // the parquet holding its frames
  int64_t from_index = -1;  // v3.0: global frame index range [from, to); -1 where absent (v2.x)
  int64_t to_index = -1;
  std::map<std::string, LeRobotVideoSpan> videos;  // by video feature key
};

struct LeRobotDataset {
  std::string dir;
  std::string version;  // "v2.0", "v2.1", "v3.0"
  double fps = 0;
  std::vector<LeRobotFeature> features;  // info.json order
  std::vector<LeRobotEpisode> episodes;  // by episode_index
  std::map<int64_t, std::string> tasks;  // task_index -> task

  const LeRobotFeature* feature(const std::string& key) const;
  std::string feature_list() const;  // "a, b, c" for messages
};

// The versions this reader accepts.
inline constexpr const char* kLeRobotVersions = "v2.0, v2.1, v3.0";

// Reads meta/ (info, episodes, tasks) and resolves each episode's data and video files; reads no frame data.
// Refuses any other codebase_version, naming the version found.
LeRobotDataset read_lerobot_dataset(const std::string& dir);

// Expands a LeRobot path template ("data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"):
// {name} and {name:0Nd} with the given integer or string values. DataError naming `what` on an unknown field
// or a malformed brace.
std::string format_lerobot_path(const std::string& pattern, const std::map<std::string, int64_t>& ints,
                                const std::map<std::string, std::string>& strings, const std::string& what);

// One episode's frame columns (no images), validated against the episode and the dataset: `length` rows,
// frame_index 0..length-1, episode_index constant, timestamps spaced 1/fps apart (within `tolerance_s`).
struct LeRobotFrames {
  int64_t first_row = 0;           // the episode's first row in its data file
  std::vector<double> timestamps;  // seconds from the episode's start
  std::vector<int64_t> task_index;
  std::vector<float> state;    // [length, state_dim]
  std::vector<float> actions;  // [length, action_dim]
};

// Reads the frame columns of every episode in `episodes` (indices into dataset.episodes) that lies in `file`.
// Returns them by position in `episodes`. `state_key`/`action_key` name vector features of the given widths.
std::map<size_t, LeRobotFrames> read_lerobot_frames(const LeRobotDataset& dataset, const std::string& file,
                                                    const std::vector<size_t>& episodes, const std::string& state_key,
                                                    int64_t state_dim, const std::string& action_key,
                                                    int64_t action_dim, double tolerance_s);

}  // namespace vlatune::trainer
