// run.json: the summary `vlatune train` writes at the end of a run, and what `vlatune check` compares.
//
//   {"schema": "vlatune.run/1",
//    "steps": 120, "warmup_steps": 20, "skipped_steps": 0,
//    "batch": 32, "seed": 0, "data": "synthetic",
//    "samples_per_s_median": 41.7, "peak_gib": 71.3,
//    "per_step": {"step_ms": [...], "loss": [...], "grad_norm": [...]},
//    "environment": {"gpu": "NVIDIA H200", "driver": "580.95.05", "cuda": "13.0", "torch": "2.11.0+cu130",
//                    "vlatune_commit": "cddd58e", "config": "full", "recipe_hash": "3f2a...", "world_size": 1}}
//
// Fields (all keys required: the file is machine-written, so a missing key is a writer bug):
//   steps          optimizer steps run, warm-up included (>= 0)
//   warmup_steps   leading steps left out of per_step and of the median (<= steps)
//   skipped_steps  steps skipped for a non-finite loss or gradient norm (<= steps)
//   batch          samples per optimizer step over all ranks (micro_batch * grad_accum * world_size, >= 1)
//   seed, data     RNG seed and data source ("synthetic" or the dataset path); null when not applicable.
//                  `check` compares per-step losses only for runs with equal seed and data.
//   samples_per_s_median  median over per_step of batch / step time (samples/s); null when per_step is empty
//   peak_gib       peak device memory allocated (GiB = 2^30 bytes); null when not measured (CPU runs)
//   per_step       one entry per step after warm-up, in step order; the three arrays have equal lengths,
//                  at most steps - warmup_steps (a resumed run warms up again and records fewer).
//                  step_ms: finite > 0. loss, grad_norm: finite, or null for a non-finite value (JSON has no NaN);
//                  null reads back as NaN.
//   environment    what a timing depends on; `check` refuses to compare runs whose environments differ.
//                  gpu/driver/cuda are null on CPU; vlatune_commit is null when not built from git;
//                  recipe_hash is recipe_hash() of the effective recipe (after command-line overrides).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

inline constexpr const char* kRunSchema = "vlatune.run/1";

struct Environment {
  std::optional<std::string> gpu;     // e.g. "NVIDIA H200"
  std::optional<std::string> driver;  // e.g. "580.95.05"
  std::optional<std::string> cuda;    // e.g. "13.0"
  std::string torch;                  // e.g. "2.11.0+cu130"
  std::optional<std::string> vlatune_commit;
  std::string config;       // "tiny" | "full"
  std::string recipe_hash;  // 16 lowercase hex digits
  int world_size = 1;
};

struct RunRecord {
  std::string schema = kRunSchema;
  int64_t steps = 0;
  int64_t warmup_steps = 0;
  int64_t skipped_steps = 0;
  int64_t batch = 0;
  std::optional<int64_t> seed;
  std::optional<std::string> data;
  std::optional<double> samples_per_s_median;
  std::optional<double> peak_gib;
  // Per step after warm-up; NaN in loss/grad_norm stands for JSON null.
  std::vector<double> step_ms;
  std::vector<double> loss;
  std::vector<double> grad_norm;
  Environment environment;
};

bool operator==(const Environment& a, const Environment& b);
// Per-step NaNs compare equal to each other (a NaN loss read back equals the NaN written).
bool operator==(const RunRecord& a, const RunRecord& b);

// The names of the environment fields that differ ("gpu", "torch", ...), in declaration order; empty when equal.
std::vector<std::string> environment_differences(const Environment& a, const Environment& b);

// The environment object alone (run.json and profile.json share it); `c` points at it.
class JsonCursor;
Environment parse_environment(const JsonCursor& c);
nlohmann::json environment_to_json(const Environment& e);

RunRecord parse_run_record(const nlohmann::json& j, const std::string& file);
RunRecord read_run_record(const std::string& path);
nlohmann::json run_record_to_json(const RunRecord& run);
// Validates (as the reader would) and writes atomically.
void write_run_record(const RunRecord& run, const std::string& path);

}  // namespace vlatune::formats
