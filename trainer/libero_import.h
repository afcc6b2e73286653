// `vlatune data import --libero DIR`: LIBERO HDF5 demo files -> a packed Dataset (spec §5, §4.6).
//
// Input, per file (every *.hdf5 / *.h5 under DIR, recursively, in path order; demos in numeric order):
//   data/demo_N/obs/agentview_rgb     uint8 [T, s, s, 3] -> camera "base_0_rgb"
//   data/demo_N/obs/eye_in_hand_rgb   uint8 [T, s, s, 3] -> camera "left_wrist_0_rgb"
//   data/demo_N/actions               [T, 7]
//   state (8 = eef pos 3 + eef axis-angle 3 + gripper qpos 2, openpi's LIBERO state):
//     data/demo_N/obs/ee_states [T, 6] (pos + axis-angle, as LIBERO writes them) ++ obs/gripper_states [T, 2];
//     when those are absent, obs/robot_states [T, 9] = gripper 2 | eef pos 3 | eef quat 4 (xyzw), converted with
//     robosuite's quat2axisangle and reordered to the same 8 dims.
//   the instruction: attribute `problem_info` (a JSON string with "language_instruction") on /data, as
//   LIBERO's create_dataset.py writes it, or on the root group.
// Choices (all also recorded in the manifest's "source"):
//   - images are stored rotated 180 degrees (both axes flipped): LIBERO renders upside down and openpi's
//     LIBERO data and policy (`img[::-1, ::-1]`) train on the rotated frames. Stored at the file's size (128 in
//     LIBERO); the loader resizes to the model's size on the device.
//   - one sample per timestep t with the chunk actions[t : t + H]; past the episode's end the last action repeats
//     (LeRobot clamps its delta-timestamp indices the same way, and openpi ignores the padding flag).
//   - q01/q99 per dim over every timestep's action and state (each timestep counted once), exact quantiles;
//     records store normalized actions and state.
//   - prompts: spec §4.6 with the given SentencePiece model; the state variant when `discrete_state`.
// Needs HDF5 and SentencePiece; without either, import_libero throws "unavailable in this build".
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "trainer/dataset.h"

namespace vlatune::trainer {

struct LiberoImportOptions {
  std::string libero_dir;
  std::string tokenizer_model;  // SentencePiece .model (PaliGemma's for real data)
  std::string out;
  int64_t horizon = 50;
  bool discrete_state = false;
  int64_t text_len = 200;
  int64_t shard_bytes = 1LL << 30;
  std::ostream* log = nullptr;  // progress and warnings (e.g. truncated prompts); null: silent
};

struct LiberoImportReport {
  DatasetManifest manifest;
  int64_t files = 0;
  int64_t episodes = 0;
  int64_t truncated_prompts = 0;
};

// True when this build can import (HDF5 and SentencePiece both present).
bool libero_import_available();
// What is missing, e.g. "HDF5 (libhdf5-dev)"; empty when available.
std::string libero_import_missing();

// Throws std::runtime_error naming the file and the dataset path that is missing or malformed, and
// std::invalid_argument for bad options.
LiberoImportReport import_libero(const LiberoImportOptions& options);

// --- Pure steps of the import, exposed for tests ---

// out[k] = actions[min(t + k, T - 1)] for k in [0, H): [H, dims] from [T, dims].
void chunk_actions(const float* actions, int64_t steps, int64_t dims, int64_t t, int64_t horizon, float* out);
// 180-degree rotation of one [side, side, 3] image (both axes flipped).
void rotate_image_180(const uint8_t* in, int64_t height, int64_t width, uint8_t* out);
// robosuite quat2axisangle for an (x, y, z, w) quaternion; zero vector for the identity.
void quat_to_axis_angle(const double quat_xyzw[4], double out[3]);

}  // namespace vlatune::trainer
