// Writes small LeRobot datasets (format v2.0, v2.1 or v3.0; image features as PNG bytes inside the parquet, or
// as MP4 video) with known contents, so tests and benchmarks can check every imported sample against the values
// that went in. Parquet through Apache Arrow's writer, PNG and video through FFmpeg's encoders: the same
// libraries the importer reads with, but the file layout is written here from LeRobot's documented format, not
// through the importer's code.
//
// Contents are pure functions of (seed, episode, frame[, camera, dim]), exposed below, so a test recomputes what a
// sample must hold. Pixels are smooth (a gradient plus a moving bright square), so lossy video keeps them close.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vlatune::testing {

struct LeRobotFixture {
  std::string dir;                   // written here (created; must not exist)
  std::string version = "v2.1";      // "v2.0" | "v2.1" | "v3.0"
  std::string storage = "image";     // "image": PNG or JPEG bytes in parquet; "video": MP4 files
  std::string image_format = "png";  // storage "image": "png" (lossless) | "jpeg" (baseline, 4:2:0, full range)
  std::string codec = "libsvtav1";   // video encoder: "libsvtav1" (AV1, yuv420p) | "libx264" | "libx265"
  std::vector<std::string> cameras = {"image", "wrist_image"};  // feature keys
  std::string state_key = "state";
  std::string action_key = "actions";
  int64_t width = 32, height = 32;  // frame size of every camera
  int64_t state_dim = 8, action_dim = 7;
  int64_t fps = 10;
  std::vector<int64_t> episode_lengths = {5, 3};
  std::vector<std::string> tasks = {"pick up the red block", "open the drawer"};  // episode e: tasks[e % size]
  int64_t episodes_per_file = 2;  // v3.0: episodes per data file and per video file
  uint64_t seed = 0;
  // State and action columns: "fixed" (fixed_size_list<float32>, as HF datasets' Sequence(length=n)) or
  // "list" (list<float32>).
  std::string vector_layout = "fixed";
  // Bad input on purpose: the PNG cell of this (episode, frame) holds bytes that are not a decodable image
  // (a PNG signature followed by garbage). -1: none.
  int64_t corrupt_image_episode = -1, corrupt_image_frame = -1;
};

// Writes the dataset; throws std::runtime_error naming what failed.
void write_lerobot_fixture(const LeRobotFixture& f);

// The values written (episodes are numbered 0.., frames 0.. within an episode).
uint8_t fixture_pixel(const LeRobotFixture& f, int64_t camera, int64_t episode, int64_t frame, int64_t y, int64_t x,
                      int64_t channel);
float fixture_state(const LeRobotFixture& f, int64_t episode, int64_t frame, int64_t dim);
float fixture_action(const LeRobotFixture& f, int64_t episode, int64_t frame, int64_t dim);
// The task string of an episode, and its task_index in meta/tasks.
const std::string& fixture_task(const LeRobotFixture& f, int64_t episode);
int64_t fixture_task_index(const LeRobotFixture& f, int64_t episode);
// [height][width][3] of one frame of one camera.
std::vector<uint8_t> fixture_frame(const LeRobotFixture& f, int64_t camera, int64_t episode, int64_t frame);

// Paths inside the written dataset (for tests that damage one file).
std::string fixture_data_file(const LeRobotFixture& f, int64_t episode);  // the parquet holding the episode
std::string fixture_video_file(const LeRobotFixture& f, int64_t camera, int64_t episode);  // storage "video" only

// Added: the dataset-wide `index` of a frame, and the position of an episode's frame 0 inside its video file
// (0 for v2.x; v3.0 concatenates `episodes_per_file` episodes per file, so from_timestamp = this / fps).
int64_t fixture_global_index(const LeRobotFixture& f, int64_t episode, int64_t frame);
int64_t fixture_video_first_frame(const LeRobotFixture& f, int64_t episode);

// Notes on what is written (see lerobot_fixture.cpp for details):
// - Paths returned above are f.dir + "/" + the dataset-relative path.
// - Pixels lie in [35, 215], the moving square is 232 (all channels); square corner and side are even, so it
//   covers whole yuv420p chroma blocks. State/action values are k * 2^-16 for integers |k| < 2^24 (exact float32).
//   All content functions use integer arithmetic only (bit-identical whatever the compiler flags).
// - Video: yuv420p, BT.601 limited range (tagged), time base 1/fps, frame i at pts i, GOP 2. libsvtav1 (preset 10,
//   crf 30) needs width and height >= 64 with SVT-AV1 1.x; libx264 / libx265 use preset veryfast, crf 18.
// - PNG: FFmpeg's png encoder, zlib level 1 (as LeRobot's PIL compress_level=1), paeth prediction.
// - JPEG: FFmpeg's mjpeg encoder, yuvj420p (full-range BT.601, as JFIF and PIL), quantizer scale 2 (high quality).
// - meta/stats.json (and v2.1 episodes_stats.jsonl, v3.0 stats/<feature>/<stat> columns): exact population
//   statistics over every frame; v3.0 adds q01/q10/q50/q90/q99 (numpy linear interpolation). Images: per channel,
//   in [0, 1], shaped [3][1][1].

}  // namespace vlatune::testing
