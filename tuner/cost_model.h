// The cost model: predicted step time and peak memory of any recipe the planner can emit, from profile.json alone.
// Assumptions (tuner/README.md says why):
//   - A quantity at micro-batch b is linear in b, fitted through the profile's two batch sizes (one batch:
//     proportional through the origin): the step time, the peak, and per module the times and the bytes.
//   - The peak is the device's measured peak; a CPU profile has none (no device allocator), so there it is
//     estimated from the memory section: parameters + gradients + optimizer state + activations.
//   - Predictions are differences from the profiled baseline at the same batch: the fitted step time and peak
//     hold the profiled recipe; recompute changes add or remove module forward times and move activation bytes
//     (recompute_solver.h's memory model, evaluated for the new selection minus the baseline's); FP8 changes
//     replace a GEMM's bf16 times by its FP8 times plus quantization; communication adds what backward cannot hide.
//   - The recompute A/B rows are ground truth for their class: each scales its units' added ms and saved bytes.
//   - Gradient accumulation (grad_accum micro-batches per optimizer step): the step is grad_accum x the micro-batch's
//     forward + backward, plus the optimizer (the "<optimizer>" row) and the exposed communication once. The
//     activations are one micro-batch's; the gradients of every parameter stay allocated through the later
//     micro-batches' forward passes (the trainer frees them after each optimizer step, so a step without
//     accumulation holds none in its forward): accumulating adds them to the peak, less those the profiled peak
//     already held (its backward peak above its forward peak, fitted over the batches; all of them without phase
//     peaks).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "formats/profile.h"
#include "formats/recipe.h"
#include "tuner/recompute_solver.h"
#include "tuner/recompute_units.h"

namespace vlatune::tuner {

// A bad planning request that is not a file problem (file problems are formats::FormatError): names the flag.
class PlanInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr double kGiB = 1073741824.0;

// value(b) = fixed + per_sample * b.
struct LinearFit {
  double fixed = 0, per_sample = 0;
  bool proportional = false;  // fitted through the origin (one batch, or a two-point fit that went negative)
  double at(double batch) const { return fixed + per_sample * batch; }
};

// Fits through (b0, v0) and, when given, (b1, v1). A negative slope gives a constant; a negative intercept gives
// the proportional fit through (b0, v0).
LinearFit fit_linear(double b0, double v0, std::optional<double> b1, std::optional<double> v1);

struct UnitModel {
  UnitSpec spec;            // aliases[0] is the recipe name
  int parent = -1;          // enclosing unit (index), -1 for none
  std::vector<int> rows;    // module rows summed (indices into batches[0].modules)
  LinearFit recompute_ms;   // time added when recomputed (calibrated)
  LinearFit act_bytes;      // held from forward to backward when not recomputed (calibrated)
  LinearFit out_bytes;      // held when recomputed
  bool baseline = false;    // recomputed in the profiled recipe
  bool size_known = true;   // false: recomputed in the baseline and its activation size was not measured
  std::string calibration;  // name of the A/B row that calibrated it, "" when none
  int gemm = -1;            // a merged GEMM's output unit (no module row): its profile.gemms index, else -1
  std::string estimate;     // how such a unit's time and bytes were estimated (the --explain text)
};

struct Calibration {
  std::string name;  // the A/B row
  bool added = true;
  int units = 0;
  double measured_step_ms_delta = 0, predicted_step_ms_delta = 0, time_factor = 1;
  double measured_saved_gib = 0, predicted_saved_gib = 0, memory_factor = 1;
  std::string note;  // clamps, fallbacks
};

// What freezing and LoRA (recipe `freeze`, `lora`) change against the profiled recipe, which trains everything: set
// by plan_trainable (trainable_change.h), empty (`active` false) otherwise. Times are per profiled step's worth of
// micro-batches, as the module rows; bytes as the recompute model's.
struct TrainableChange {
  bool active = false;
  std::vector<std::string> frozen;       // modules frozen whole (resolved FQNs)
  std::vector<std::string> no_backward;  // modules whose backward no longer runs (layout::backward_free_modules)
  std::vector<std::string> kept;         // what still runs backward inside them (their scopes at run time)
  LinearFit backward_removed_ms;         // the rows' backward of `no_backward` less `kept`
  double gemm_removed_ms = 0;  // at the profiled batch: weight gradients (and dead input gradients) of frozen GEMMs
  double adapter_ms = 0;       // at the profiled batch: the LoRA adapters' GEMMs (an estimate)
  LinearFit activation_removed_bytes;       // the rows of `no_backward` less `kept`: held no more
  std::vector<char> unit_no_backward;       // per unit: inside `no_backward` (no candidate, no bytes)
  std::vector<LinearFit> unit_act_removed;  // per unit: activation bytes of `no_backward` inside it
  double frozen_numel = 0, adapter_numel = 0, trainable_numel = 0, total_numel = 0;
  double frozen_parameter_bytes = 0;  // outermost frozen rows' parameter_bytes
  double fixed_gib = 0;     // held at every phase: adapters' parameters, minus frozen moments, plus adapters' moments
  double gradient_gib = 0;  // the trainable parameters' gradients (the profile's are CostModel::gradient_gib)
  double state_delta_gib = 0;  // gradients + moments + adapters moved, against the profiled training
  double optimizer_ms = 0;     // the "<optimizer>" row scaled by trainable over all elements
  double micro_ms(double batch, double profiled_batch) const {
    return -backward_removed_ms.at(batch) + (adapter_ms - gemm_removed_ms) * batch / profiled_batch;
  }
};

struct CostModel {
  std::string file;  // labels errors
  formats::Profile profile;
  double profiled_peak_gib = 0;          // at the profiled batch: measured, or estimated (peak_source says which)
  std::string peak_source;               // "measured" or how it was estimated
  std::vector<std::string> module_fqns;  // batches[0] rows, profile order
  // What recompute patterns resolve against: module_fqns, then the recomputable units that are not modules (the
  // backbone MLPs' merged gate+up outputs, `...mlp.gate_proj+up_proj`, sized from the GEMM inventory).
  std::vector<std::string> recompute_names;
  int64_t profiled_batch = 0;
  std::optional<int64_t> second_batch;
  LinearFit step_ms, peak_gib;      // the profiled recipe
  double noise_rel = 0;             // median absolute deviation / median of batches[0].step_ms_samples
  std::vector<UnitModel> units;     // parents before children, forward order
  std::vector<int> baseline_units;  // the profiled recipe's recompute selection
  std::vector<Calibration> calibrations;
  std::vector<std::string> notes;  // fallbacks worth saying (rationale)
  // The planned optimizer state minus the profiled one (GiB, set by plan_optimizer_state): the peak holds the
  // state at every phase, so it moves the memory that recompute cannot change.
  double optimizer_delta_gib = 0;
  int profiled_grad_accum = 1;  // the profiled recipe's: its step_ms holds that many micro-batches
  double optimizer_ms = 0;      // the "<optimizer>" row of batches[0] (self_ms): once per optimizer step
  double gradient_gib = 0;      // memory.gradient_bytes of batches[0] (else the parameters'): held when accumulating
  std::optional<LinearFit> backward_over_forward_gib;  // peak minus the forward phase's peak, when both measured
  TrainableChange trainable;
};

// Bytes of AdamW's two moments for `numel` parameters stored in `element_bytes` each: "auto" keeps the moments in
// the parameters' dtype (bf16 with precision bf16, fp32 with fp32-master), "int8-blockwise" stores a uint8 code per
// element and an fp32 absmax per kernels::kAdamwQuantBlock. The trainer keeps tensors under 4,096 elements at full
// precision; they are counted as 8-bit here (norm scales and biases: under a MiB for Pi0.5).
double adamw_moment_bytes(double numel, double element_bytes, formats::StateDtype state_dtype);

// ---- Parameters, gradients and optimizer state under freezing and LoRA (recipe `freeze`, `lora`) ----
// One parameter tensor of the model: its name (`<module>.weight`, ...) and shape ([out, in] for a Linear's weight).
struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
};
// What trains (resolved: exact module FQNs, as trainer/recipe_apply.h resolves the recipe): the parameters inside
// `frozen` modules do not; a Linear in `lora` keeps its weight and bias frozen and trains adapters A [rank, in] and
// B [out, rank] instead (model/lora.h).
struct TrainableSelection {
  std::vector<std::string> frozen;
  std::vector<std::pair<std::string, int64_t>> lora;  // Linear FQN, rank
};
struct TrainingStateBytes {
  double parameter_bytes = 0;  // every parameter (frozen ones too) and the adapters
  double gradient_bytes = 0;   // the trainable parameters' gradients, in the parameters' dtype
  double optimizer_bytes = 0;  // AdamW's moments of the trainable parameters (adamw_moment_bytes per tensor)
  double trainable_numel = 0, frozen_numel = 0, adapter_numel = 0;
};
// The bytes the trainer holds for parameters, gradients and optimizer state whatever the batch, given the model's
// parameters (all of them, with their names), the selection, the parameters' element size (2: precision bf16, 4:
// fp32-master, where fp32 parameters are their own masters) and the moments' storage. PlanInputError naming a
// LoRA'd Linear whose `<fqn>.weight` is not a 2-D parameter of the list.
TrainingStateBytes training_state_bytes(const std::vector<ParameterShape>& params, const TrainableSelection& selection,
                                        double element_bytes, formats::StateDtype state_dtype);

// Prices `planned` moments, held by each GPU as 1/`planned_shards` of them (recipe
// distributed.shard_optimizer_state: the world size, else 1), against the profiled recipe's optimizer.state_dtype
// and sharding (its distributed.shard_optimizer_state over the profile's environment.world_size): sets
// model.optimizer_delta_gib from the profile's parameter bytes (memory.parameter_bytes of batches[0], in the
// profiled precision's dtype) and returns it. Throws PlanInputError when the state changes and the profile has no
// parameter bytes.
double plan_optimizer_state(CostModel& model, formats::StateDtype planned, int planned_shards = 1);

// A module row that is not a module ("<optimizer>", "<data>", ...).
bool is_pseudo_row(const formats::ModuleCost& row);
// The rows of `b` summed for `alias`: its own row, else the outermost rows inside it (indices into b.modules).
std::vector<int> rows_for(const formats::BatchProfile& b, const std::string& alias);
// Those of `rows` (indices into b.modules) that lie inside no other of them.
std::vector<int> outermost_rows(const formats::BatchProfile& b, const std::vector<int>& rows);
// True when the profiled recipe runs `gemm` in FP8 (a pattern of its fp8.modules matches a member).
bool profiled_in_fp8(const formats::Profile& profile, const formats::GemmEntry& gemm);

// Validates the profile for planning and builds the model, in steps (cost_model_build.cpp): fit the batches, find
// the units that are merged-GEMM outputs, check the profiled selection, collect the candidate units, size them
// from the rows, link parents, calibrate with the A/B rows. Throws formats::FormatError(file, JSON path, reason)
// for a profile the planner cannot use (no modules, a CUDA profile without its peak memory, a CPU profile without
// its parameter bytes, non-monotonic batches, patterns that match no row or nest, rows recomputed outside the
// profiled recipe), and PlanInputError for a bad extra candidate.
// `extra_candidates`: --recompute-candidate patterns, resolved against the module rows.
CostModel build_cost_model(const formats::Profile& profile, const std::string& file,
                           const std::vector<std::string>& extra_candidates = {});

// The solver's problem at micro-batch b for a memory budget (GiB): one item per unit, sizes and costs at b, the
// budget left for activations once what recompute cannot change is set aside (negative: nothing fits).
struct RecomputeAtBatch {
  double batch = 0;
  double baseline_act_peak_bytes = 0;  // the memory model's activation peak of the profiled selection
  double other_gib = 0;                // predicted peak minus the activation peak: what recompute cannot change
};
// grad_accum: the plan's (gradient_delta_gib() moves what recompute cannot change).
RecomputeAtBatch recompute_problem(const CostModel& model, int64_t batch, double budget_gib, RecomputeProblem& problem,
                                   int grad_accum = 1);

// What the gradients held at the peak add to the profiled recipe's at micro-batch b. Accumulating holds every
// trainable parameter's gradient (a profile that accumulated held them all); without accumulation the peak holds
// what the profiled one did (its backward peak above its forward peak), at most the trainable gradients.
double gradient_delta_gib(const CostModel& model, int grad_accum, double batch);

// What one recipe is predicted to do.
struct Candidate {
  int64_t micro_batch = 0;
  std::vector<int> recompute;  // unit indices
  std::vector<int> fp8;        // gemm indices (into profile.gemms)
  double comm_exposed_ms = 0;  // from the grouping (0 on one GPU)
};

struct Prediction {
  double step_ms = 0, peak_gib = 0, samples_per_s = 0;
  double recompute_ms = 0;  // recompute time relative to the profiled selection at this batch
  double fp8_ms = 0;        // FP8 time change (negative = faster)
  double comm_ms = 0;       // exposed communication
  double trainable_ms = 0;  // freezing and LoRA: backward removed, adapters added, the optimizer rescaled
};

// One optimizer step of grad_accum micro-batches on each of world_size GPUs (recipe semantics): the time of
// grad_accum micro-batches plus the optimizer and the exposed communication once; samples = micro-batch x
// grad_accum x world_size.
Prediction predict(const CostModel& model, const Candidate& candidate, int grad_accum = 1, int world_size = 1);

// Time of one GEMM per step under a precision, at micro-batch b (times scale with M = b x tokens), its forward
// counted twice when recomputed.
double gemm_ms(const formats::GemmEntry& gemm, bool fp8, bool recomputed, double batch_scale);

// Per-module quantities of `root` (its own row, else the outermost rows inside it): the backward time at batch b
// (fitted over the batches) and the parameter bytes.
double root_backward_ms(const CostModel& model, const std::string& root, double batch);
double root_parameter_bytes(const CostModel& model, const std::string& root);

// True when `fqn` lies inside a unit of `selection` (or is a member of a selected merged GEMM's output unit).
bool inside_selection(const CostModel& model, const std::vector<int>& selection, const std::string& fqn);

}  // namespace vlatune::tuner
