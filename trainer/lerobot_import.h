// `vlatune data import --lerobot DIR [--lerobot DIR2 ...]`: LeRobot datasets (v2.0, v2.1, v3.0; images as PNG/JPEG
// in parquet or as MP4 video) -> a packed Dataset, with samples built as openpi builds them from LeRobot:
//   - one sample per frame t: the cameras at t, the state at t, and the action chunk actions[t .. t+H-1] with
//     indices past the episode's last frame clamped to it (LeRobot's delta_timestamps plus padding; openpi ignores
//     the padding flag);
//   - the prompt: the frame's task string (its task_index in meta/tasks) through the PaliGemma tokenizer (spec
//     §4.6), or the discrete-state prompt with `discrete_state`;
//   - images: openpi's resize_with_pad to `image_side` (trainer/image_resize.h); video frames are the ones whose
//     timestamps are within `tolerance_s` of the frame's (LeRobot's rule and its default, 1e-4 s);
//   - state and actions quantile-normalized with the training episodes' own statistics (trainer/norm_stats.h).
//
// Norm stats come from a first pass that reads only the parquet columns of state and actions (no image decoded):
// mean, std, q01, q99 of the state (each frame once) and of the actions as they appear in the chunks (frame j
// counted once per chunk it is in), the definition of openpi's compute_norm_stats, with exact quantiles.
//
// Episodes are numbered 0.. across the sources in order (each source's episodes by episode_index). `episodes`
// picks some ("A:B" half-open, "3,7,9", or a mix "0:10,15"); `val_episodes` moves some of the picked ones to a
// second dataset OUT/val ("N": the last N; or indices as above), normalized with the training statistics.
//
// Output appears only when everything succeeded: the datasets are written to OUT.partial-import and renamed to
// OUT at the end. A leftover OUT.partial-import (an import that was killed) is removed when the import is run
// again, which starts clean.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/dataset.h"

namespace vlatune::trainer {

struct LeRobotImportOptions {
  std::vector<std::string> sources;  // dataset roots (meta/info.json inside)
  std::string tokenizer_model;       // SentencePiece .model
  std::string out;
  std::vector<std::string> cameras;  // feature keys in slot order; empty: every image/video feature, info.json order
  std::string state_key;             // empty: "observation.state" or "state", whichever exists
  std::string action_key;            // empty: "action" or "actions"
  std::string episodes;              // empty: all
  std::string val_episodes;          // empty: none
  int64_t horizon = 50;
  bool discrete_state = false;
  int64_t text_len = 200;
  int64_t image_side = 224;
  int64_t workers = 0;  // decoding threads; 0: one per hardware thread
  double tolerance_s = 1e-4;
  int64_t shard_bytes = 1LL << 30;
  std::ostream* log = nullptr;  // choices, progress and warnings; null: silent
  bool progress_bar = false;    // redraw one progress line (a terminal) instead of printing lines
};

struct LeRobotImportReport {
  DatasetManifest train;
  DatasetManifest val;  // samples == 0 when there is no validation split
  std::string version;  // of the first source
  std::vector<std::string> camera_keys;
  std::string state_key, action_key;
  int64_t episodes = 0, frames = 0, val_episodes = 0, val_frames = 0;
  double stats_seconds = 0;   // the first pass (tables and norm stats)
  double decode_seconds = 0;  // the second pass (decode, resize, write)
  int64_t truncated_prompts = 0;
};

// True when this build can import LeRobot datasets (Arrow/Parquet, FFmpeg and SentencePiece all present).
bool lerobot_import_available();
// What is missing, e.g. "FFmpeg (libavformat-dev ...)"; empty when available.
std::string lerobot_import_missing();

// DataError for a bad dataset file (naming the file, episode, frame, column), std::invalid_argument for bad
// options (an unknown feature key lists the ones there are), std::runtime_error for output I/O.
LeRobotImportReport import_lerobot(const LeRobotImportOptions& options);

// The episode selection syntax above, over `count` episodes: sorted, unique indices. std::invalid_argument naming
// `flag` on a malformed or out-of-range spec.
std::vector<int64_t> parse_episode_selection(const std::string& spec, int64_t count, const std::string& flag);

// How many chunks frame j of a T-frame episode appears in, for chunks of `horizon` with clamping: weights[j].
std::vector<int64_t> chunk_weights(int64_t frames, int64_t horizon);

}  // namespace vlatune::trainer
