// profile.json: what `vlatune profile` measures and the only input of `vlatune plan` (and of report/check).
//
//   {"schema": "vlatune.profile/1",
//    "environment": {... as run.json ...},
//    "settings": {"device": "cuda", "tracer": "cupti", "data": "synthetic", "steps": 6, "warmup": 3,
//                 "gpu_memory_gib": 139.8, "compute_capability": "9.0", "workload": "train", "degraded": []},
//    "recipe": {... the effective recipe profiled, canonical form (formats/recipe.h) ...},
//    "recomputable": ["...vision_tower", "...encoder.layers.0", ...],
//    "batches": [ {batch profile at the requested batch}, {at a smaller batch} ],
//    "gemms": [ ... ], "overhead": {...} | null, "communication": {...} | null}
//
// settings.workload: "train" (optimizer steps, what `vlatune plan` reads) or "inference" (`vlatune profile
// --inference`: one sampled action chunk per step). settings.compute_capability: the GPU's "major.minor" (null on
// CPU). Both optional on read (absent in profiles written before them: workload "train", capability unknown).
//
// Units: times in ms per optimizer step (GPU kernel time when device is "cuda", host time of ATen ops inside
// scopes when "cpu"), sizes in bytes (integers) or GiB (2^30 bytes, floating). Per-step figures are means over
// the traced steps; `step_ms` and `data_wait_ms` are medians of untraced, timed steps, run as `vlatune train` runs
// them (on one process each queued before the previous one is read).
//
// batches[i] (at least one; batches[0] is the requested batch, further ones are smaller, for extrapolation):
//   batch             micro-batch profiled (>= 1)
//   step_ms           median step time (ms > 0); step_ms_samples: the timed steps it came from (>= 1 entries)
//   data_wait_ms      median time a timed step waited for its batch (ms >= 0; included in step_ms: the time
//                     the data source's next() blocked on the loader); data_wait_ms_samples: one entry per
//                     step_ms_samples entry, the same steps. Optional, both keys or neither: absent in profiles
//                     written before it (unknown, not 0). With `data: synthetic` it is ~0 (batches made on the
//                     device), a real measurement
//   peak_gib          peak allocated device memory over the step (GiB; on CPU: null)
//   memory            parameter/gradient/optimizer/activation bytes (activation = kept from the end of forward
//                     to backward, all modules), peak GiB per phase ("forward", "backward", "optimizer"); null
//                     values where not measurable (CPU)
//   modules[]         one row per module FQN (openpi names) or pseudo-module "<optimizer>", "<loss>", "<data>",
//                     "<comm>", "<inputs>" (masks, positions, RoPE tables, time embedding from the batch);
//                     "inclusive" follows the scopes as they nest at run time, not the name tree: for Pi0.5 the
//                     backbone layer's scope encloses the whole joint layer (the expert layer's scope opens
//                     inside it) and the backbone self_attn's encloses the joint attention (both branches); times are
//                     INCLUSIVE of child modules (a parent's forward_ms includes its children's), self_ms is the
//                     exclusive time over all phases; sum(self_ms) = attributed GPU time. activation_bytes: allocator
//                     growth across the module's forward that is still held when it returns (what recomputing it could
//                     free, plus its output); 0 for pseudo. output_bytes: its output tensors; recomputing the module
//                     frees about activation_bytes - output_bytes (the recompute A/B rows calibrate this). recomputed:
//                     the profiled recipe recomputes it (then backward_ms includes no recompute; recompute_ms holds the
//                     recomputed forward).
//   kernels[]         per kernel name: calls and ms per step, category ("gemm", "attention", "elementwise",
//                     "reduction", "optimizer", "memcpy", "memset", "communication", "other"); sites (optional;
//                     absent in profiles before it): where the kernel ran, the largest first, at most kMaxKernelSites
//                     of them: {module (the innermost scope's module row, layer indices folded into `*`: a
//                     pattern such as "...language_model.layers.*.mlp", fqn_pattern.h), phase ("forward", "backward",
//                     "recompute", "optimizer", "other"), calls, ms} per step
//   attribution       fraction of GPU time inside some scope, the unattributed kernels by name, dropped records
//   recompute[]       A/B measurements, one per candidate class: the same steps with the candidate's patterns
//                     recomputed in addition to (or removed from) the profiled recipe's; step_ms_delta (ms, +
//                     = slower), peak_gib_delta (GiB, - = less memory), ms_per_gib_saved (null when nothing saved)
//
// gemms[] (at batches[0].batch): one row per Linear FQN or merged GEMM (members = the Linear FQNs it covers;
// name = members[0] for a plain Linear). (m, k, n): y[m, n] = x[m, k] W^T. bf16 and fp8 hold the three GEMMs'
// median GPU times (forward, grad_input, grad_weight); fp8 = null when FP8 was not measured (e.g. CPU or a dim
// not divisible by 16); quant_ms: the FP8 quantization cost per step for this GEMM as the trainer runs it.
//
// overhead: untraced vs traced median step time, both read step by step (a traced step does not overlap the next);
// fraction = traced / untraced - 1.
// communication (multi-GPU only; `vlatune profile` under `vlatune launch --nproc N`, profiler/comm_stats.h):
//   world_size (>= 2); groups[] in launch order: name, bytes all-reduced per step, allreduce_ms (NCCL kernel time
//   per step, median over the traced steps); allreduce_gbps: bus bandwidth sum(bytes) x 2 (n-1)/n / sum(ms);
//   exposed_ms: end of the last NCCL kernel minus end of the last backward compute kernel (>= 0), median per step.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/recipe.h"
#include "formats/run_record.h"

namespace vlatune::formats {

inline constexpr const char* kProfileSchema = "vlatune.profile/1";

// A GPU's compute capability (CUDA's major.minor), e.g. 8.9 on an L40S: what features it has (FP8 needs >= 8.9).
struct ComputeCapability {
  int major = 0, minor = 0;
  bool at_least(int ma, int mi) const { return major > ma || (major == ma && minor >= mi); }
  std::string to_string() const { return std::to_string(major) + "." + std::to_string(minor); }
  bool operator==(const ComputeCapability& o) const { return major == o.major && minor == o.minor; }
};

struct ProfileSettings {
  std::string device = "cpu";      // "cuda" | "cpu"
  std::string workload = "train";  // "train" | "inference"
  std::string tracer = "cpu";      // "cupti" | "cpu" | "none" (tracing unavailable: times are whole steps only)
  std::string data = "synthetic";
  int64_t steps = 0;                                    // traced steps per batch
  int64_t warmup = 0;                                   // untraced steps before them
  std::optional<double> gpu_memory_gib;                 // total memory of the device; null on CPU
  std::optional<ComputeCapability> compute_capability;  // of the device; null on CPU and in older profiles
  std::vector<std::string> degraded;                    // human-readable reasons the profile is less than complete
};

struct ModuleCost {
  std::string fqn;   // openpi FQN, or a pseudo-module "<optimizer>", "<loss>", "<data>", "<comm>", "<inputs>"
  std::string kind;  // module type ("Linear", "RMSNorm", "GemmaDecoderLayer", ...) or "pseudo"
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0;  // inclusive, per step
  double self_ms = 0;                                        // exclusive, all phases, per step
  int64_t kernels = 0;                                       // kernel launches per step, inclusive
  int64_t activation_bytes = 0;                              // see above
  int64_t output_bytes = 0;     // bytes of the forward's output tensors (kept by consumers even when recomputed)
  int64_t parameter_bytes = 0;  // inclusive
  bool recomputed = false;
};

// Where a kernel ran: the module whose scope launched it (innermost; layer indices folded into `*`, so the 18
// layers of a stack are one site) and the phase.
struct KernelSite {
  std::string module;  // an FQN or FQN pattern (fold_indices), or a pseudo-module ("<optimizer>", ...)
  std::string phase;   // "forward", "backward", "recompute", "optimizer" or "other"
  double calls = 0;    // per step
  double ms = 0;       // per step
};
inline constexpr size_t kMaxKernelSites = 8;

struct KernelStat {
  std::string name;
  std::string category;           // see above
  double calls = 0;               // per step (mean; may be fractional)
  double ms = 0;                  // per step
  std::vector<KernelSite> sites;  // largest first; empty for unattributed kernels and older profiles
};

struct Attribution {
  double gpu_ms = 0;               // all device activity per step
  double attributed_fraction = 0;  // 0..1
  int64_t dropped_records = 0;
  std::vector<KernelStat> unattributed;  // by name, largest first
};

struct MemoryStats {
  std::optional<int64_t> parameter_bytes, gradient_bytes, optimizer_bytes, activation_bytes;
  std::map<std::string, double> peak_gib_by_phase;  // "forward" | "backward" | "optimizer"
};

struct RecomputeCandidate {
  std::string name;                   // e.g. "vit_layers", "backbone_mlp", or the user's pattern
  std::vector<std::string> patterns;  // FQN patterns (recipe syntax)
  bool added = true;                  // true: recomputed on top of the profiled recipe; false: removed from it
  double step_ms_delta = 0;           // candidate - baseline
  double peak_gib_delta = 0;          // candidate - baseline
  std::optional<double> ms_per_gib_saved;
};

struct BatchProfile {
  int64_t batch = 1;
  double step_ms = 0;
  std::vector<double> step_ms_samples;
  std::optional<double> data_wait_ms;        // nullopt: not measured (older profiles)
  std::vector<double> data_wait_ms_samples;  // as step_ms_samples, when data_wait_ms is set
  std::optional<double> peak_gib;
  MemoryStats memory;
  std::vector<ModuleCost> modules;
  std::vector<KernelStat> kernels;
  Attribution attribution;
  std::vector<RecomputeCandidate> recompute;
};

struct GemmTimes {
  double forward_ms = 0, grad_input_ms = 0, grad_weight_ms = 0;
  double total() const { return forward_ms + grad_input_ms + grad_weight_ms; }
};

struct GemmEntry {
  std::string name;
  std::vector<std::string> members;  // >= 1 Linear FQNs
  int64_t m = 0, k = 0, n = 0;
  GemmTimes bf16;
  std::optional<GemmTimes> fp8;
  std::optional<double> quant_ms;
  bool recomputed = false;  // its forward GEMM runs twice per step in the profiled recipe
};

struct Overhead {
  double untraced_step_ms = 0, traced_step_ms = 0;
  double fraction() const { return untraced_step_ms > 0 ? traced_step_ms / untraced_step_ms - 1 : 0; }
};

struct GroupComm {
  std::string name;   // recipe group name
  int64_t bytes = 0;  // gradient bytes reduced for the group
  double allreduce_ms = 0;
};

struct Communication {
  int world_size = 2;
  double allreduce_gbps = 0;  // measured bus bandwidth (GB/s = 1e9 bytes/s)
  double exposed_ms = 0;      // communication not overlapped by compute, per step
  std::vector<GroupComm> groups;
};

struct Profile {
  std::string schema = kProfileSchema;
  Environment environment;
  ProfileSettings settings;
  Recipe recipe;
  // FQNs the trainer can recompute (recipe.recompute.modules may name these; nothing else). For Pi0.5 the joint
  // units use the backbone's names: `...language_model.layers.i` recomputes both branches of joint layer i and
  // `...language_model.layers.i.self_attn` the joint attention of both; MLPs are per branch.
  std::vector<std::string> recomputable;
  std::vector<BatchProfile> batches;
  std::vector<GemmEntry> gemms;
  std::optional<Overhead> overhead;
  std::optional<Communication> communication;
};

// Validates and converts; errors are FormatError(file, json_path, reason). Beyond types: batches non-empty with
// distinct batch sizes, batches[0] the largest; module FQNs unique per batch; fractions in 0..1; GEMM dims >= 1;
// data_wait_ms_samples as many as step_ms_samples.
Profile parse_profile(const nlohmann::json& j, const std::string& file);
Profile read_profile(const std::string& path);
// The profile.json a user means by `path`: DIR/profile.json for a directory (what `vlatune profile --out DIR`
// writes), otherwise `path` itself.
std::string profile_file(const std::string& path);
nlohmann::json profile_to_json(const Profile& profile);
// Validates (as the reader would) and writes atomically.
void write_profile(const Profile& profile, const std::string& path);

}  // namespace vlatune::formats
