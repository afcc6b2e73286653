// recipe.json: what `vlatune plan` emits and `vlatune train` obeys (DESIGN.md "The recipe"; every key, type,
// default and unit is documented in recipes/README.md).
//
// Every key is optional and defaults to the value below; a default-constructed Recipe is the all-defaults recipe.
// parse_recipe is strict: an unknown key anywhere, a wrong type, a bad enum value, a wrong schema string, a
// non-positive size or a malformed module pattern is a FormatError naming the file and the JSON path:
//   recipe.json: $.batch.micro_batch: expected an integer in 1..1048576, got 0
//   recipe.json: $.fp8.modules[3]: '*' inside segment 'layers*' of pattern '...': only a whole segment '*' ...
// Patterns are only checked for syntax here; whether they match modules is checked against the model with
//   resolve_patterns(recipe.recompute.modules, module_fqns, file, "$.recompute.modules")
// (likewise "$.fp8.modules", "$.freeze.modules", "$.lora.targets[t].modules" and "$.groups[g].modules"), so that
// error carries the same path. Presets are names here; layout/pi05.h says which modules each one selects.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vlatune::formats {

inline constexpr const char* kRecipeSchema = "vlatune.recipe/1";

enum class Attention { kLean, kMaterialized };  // "lean" | "materialized"
// Which kernels run the lean joint attention on CUDA: "auto" cuDNN's padding-mask SDPA where it builds, else
// FlashAttention-2 over variable-length sequences, else SDPA with the mask tensor; "cudnn" (or an error), "flash"
// (FlashAttention-2 varlen), "sdpa" (the mask tensor). Elsewhere (CPU, fp32) SDPA with the mask tensor.
enum class AttentionBackend { kAuto, kCudnn, kFlash, kSdpa };  // "auto" | "cudnn" | "flash" | "sdpa"
enum class Precision { kBf16, kFp32Master };                   // "bf16" | "fp32-master"
// Both are one scale per tensor. "tensorwise": current scaling (the amax of the tensor being cast);
// "delayed": the amax history of the previous casts of that tensor (one pass; the first cast is current).
enum class Fp8Scaling { kTensorwise, kDelayed };  // "tensorwise" | "delayed"
// How an FP8 down projection keeps its GeGLU input (the gate+up GEMM's output) for the backward: "bf16" as computed,
// or "e4m3-blocks": e4m3 with one scale per 64 consecutive elements of a row, half the bytes (the GeGLU gradient
// then reads the dequantized values, as DeepSeek-V3 caches its SwiGLU inputs). The forward is unchanged.
enum class SavedGegluInputs { kBf16, kE4m3Blocks };  // "bf16" | "e4m3-blocks"
// Which cuBLASLt algorithm each FP8 GEMM runs: "heuristic" = the heuristic's first choice (what at::_scaled_mm runs);
// "timed" = the fastest of the heuristic's first candidates, timed once per GEMM problem on its first call. Different
// algorithms may round differently, and timing noise can pick differently between runs.
enum class Fp8GemmAlgorithm { kHeuristic, kTimed };  // "heuristic" | "timed"
enum class ReduceDtype { kBf16, kFp32 };             // "bf16" | "fp32"
// How AdamW's moments are stored: "auto" = the dtype `precision` gives; "int8-blockwise" = 8-bit codes with an
// fp32 absmax per 256 values (kernels/adamw.h).
enum class StateDtype { kAuto, kInt8Blockwise };  // "auto" | "int8-blockwise"

// Named freezing presets, as LeRobot's Pi0.5 options: "freeze_vision_encoder" (the SigLIP vision tower),
// "train_expert_only" (all of PaliGemma: vision tower, projector, Gemma 2B language model).
enum class FreezePreset { kFreezeVisionEncoder, kTrainExpertOnly };
// Named LoRA presets: "openpi" (openpi's gemma_2b_lora + gemma_300m_lora configs and their freeze filter).
enum class LoraPreset { kOpenpi };

// openpi's gemma_2b_lora rank; a LoRA target without "rank" gets it, and without "alpha" alpha = rank (scaling 1,
// as both of openpi's LoRA variants).
inline constexpr int kLoraDefaultRank = 16;

const char* to_string(Attention v);
const char* to_string(AttentionBackend v);
const char* to_string(Precision v);
const char* to_string(Fp8Scaling v);
const char* to_string(SavedGegluInputs v);
const char* to_string(Fp8GemmAlgorithm v);
const char* to_string(ReduceDtype v);
const char* to_string(StateDtype v);
const char* to_string(FreezePreset v);
const char* to_string(LoraPreset v);

// One explained decision of the planner, e.g.
//   {"decision": "recompute paligemma_with_expert.paligemma.model.language_model.layers.*.mlp",
//    "reason": "cheapest memory: 0.8 ms per GiB saved; needed 11.2 GiB under the 120 GiB budget",
//    "numbers": {"ms_per_gib_saved": 0.8, "saved_gib": 11.2}}
// `decision` and `reason` are required non-empty strings; `numbers` (optional, default {}) maps names with units
// in them to finite numbers, for reports to plot.
struct Rationale {
  std::string decision;
  std::string reason;
  std::map<std::string, double> numbers;
};

struct Recipe {
  struct Batch {
    int micro_batch = 32;  // samples per forward/backward on one GPU
    int grad_accum = 1;    // micro-batches per optimizer step
  };
  struct Data {
    std::optional<int> num_images;  // camera slots kept; nullopt = drop slots masked for the whole batch
    bool trim_text = true;          // trim prompt padding (exact: identical loss)
    int trim_multiple = 16;         // ... rounding the trimmed length up to a multiple of this (tokens)
  };
  struct ModelOptions {
    bool skip_dead = true;  // skip computation whose result is unused (exact)
    Attention attention = Attention::kLean;
    AttentionBackend attention_backend = AttentionBackend::kAuto;
    Precision precision = Precision::kBf16;
    // "step": each training step (forward, backward, clipping, AdamW) replays one captured CUDA graph; "off": eager.
    bool cuda_graph_step = false;
  };
  struct Recompute {
    std::vector<std::string> modules;  // FQN patterns
  };
  struct Fp8 {
    Fp8Scaling scaling = Fp8Scaling::kTensorwise;
    std::vector<std::string> modules;                                // FQN patterns of Linear modules
    SavedGegluInputs saved_geglu_inputs = SavedGegluInputs::kBf16;   // written to JSON only when not bf16
    Fp8GemmAlgorithm gemm_algorithm = Fp8GemmAlgorithm::kHeuristic;  // written to JSON only when not heuristic
  };
  // Parameters of these modules get no gradient and no optimizer state (the union of the presets and the patterns).
  struct Freeze {
    std::vector<FreezePreset> presets;  // each at most once
    std::vector<std::string> modules;   // FQN patterns
  };
  // Low-rank adapters on Linears: y = x W^T (+ b) + (alpha / rank) (x A^T) B^T with A [rank, in], B [out, rank];
  // the Linear's own weight and bias are frozen.
  struct LoraTarget {
    std::vector<std::string> modules;  // required, non-empty: FQN patterns of Linear modules
    int rank = kLoraDefaultRank;       // 1..min(in, out) of every Linear it selects (checked against the model)
    double alpha = kLoraDefaultRank;   // > 0, finite; absent in the file: = rank
  };
  struct Lora {
    std::optional<LoraPreset> preset;  // expands to its targets and freezing, before `targets`
    std::vector<LoraTarget> targets;
  };
  struct Group {
    std::string name;                  // required, unique, e.g. "vision", "layer.3", "heads.in"
    std::vector<std::string> modules;  // required, non-empty: FQN patterns
    bool cuda_graph = false;           // capture the group's forward/backward as a CUDA graph
  };
  struct Optimizer {
    StateDtype state_dtype = StateDtype::kAuto;
  };
  struct Distributed {
    int world_size = 1;
    ReduceDtype reduce_dtype = ReduceDtype::kBf16;  // gradient all-reduce dtype
    // AdamW's state split over the data-parallel ranks (ZeRO-1): each holds 1/world_size of it. Written to JSON
    // only when true (the default recipe's hash is kept).
    bool shard_optimizer_state = false;
  };
  // Provenance and prediction: informational, excluded from recipe_hash.
  struct TunedOn {
    std::optional<std::string> gpu, torch, profile;
  };
  struct Predicted {
    std::optional<double> step_ms, peak_gib, samples_per_s;  // finite, >= 0
  };

  std::string schema = kRecipeSchema;
  std::string model = "pi05";  // the only model so far
  Batch batch;
  Data data;
  ModelOptions model_options;
  Recompute recompute;
  Fp8 fp8;
  Freeze freeze;  // written to JSON only when not all defaults, as `optimizer` and `lora`
  Lora lora;
  std::vector<Group> groups;  // empty = the default grouping (one group per named unit)
  Optimizer optimizer;        // written to JSON only when not all defaults (the default recipe's hash is kept)
  Distributed distributed;
  TunedOn tuned_on;
  Predicted predicted;
  std::vector<Rationale> rationale;
};

bool operator==(const Rationale& a, const Rationale& b);
bool operator==(const Recipe& a, const Recipe& b);
inline bool operator!=(const Recipe& a, const Recipe& b) {
  return !(a == b);
}
// True when the section changes nothing: every parameter trains, no adapters.
bool is_default(const Recipe::Freeze& f);
bool is_default(const Recipe::Lora& l);

// Validates and converts a parsed document; `file` only names the source in errors.
Recipe parse_recipe(const nlohmann::json& j, const std::string& file);

// Reads and validates a recipe file. Missing/unreadable file or invalid JSON -> FormatError naming the file (JSON
// syntax errors give the byte offset, line and column).
Recipe read_recipe(const std::string& path);

// The canonical JSON form: every key present (defaults written out), keys sorted.
nlohmann::json recipe_to_json(const Recipe& recipe);

// Validates (as parse_recipe would, so a written recipe always reads back) and writes atomically.
void write_recipe(const Recipe& recipe, const std::string& path);

// A stable identity of what a recipe makes the trainer do: FNV-1a 64 of the compact canonical JSON without
// tuned_on, predicted and rationale, as 16 lowercase hex digits. The pattern lists of recompute, fp8, freeze, of
// each LoRA target and of each group, and the freeze presets, are sorted and deduplicated first (their order does
// not change the selection); group and LoRA target order is kept.
// run.json stores it so `vlatune check` can refuse to compare runs of different recipes.
std::string recipe_hash(const Recipe& recipe);

// The keys that make two recipes' recipe_hash differ, one "path: a vs b" line each, in key order, e.g.
//   "batch.micro_batch: 32 vs 2", "model_options.precision: \"bf16\" vs \"fp32-master\"",
//   "fp8.modules: added \"...mlp.gate_proj\"; removed \"...o_proj\"" (pattern lists compare as sets).
// Empty exactly when the hashes are equal; tuned_on, predicted and rationale are not compared.
std::vector<std::string> recipe_differences(const Recipe& a, const Recipe& b);

}  // namespace vlatune::formats
