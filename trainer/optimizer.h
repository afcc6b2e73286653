// AdamW for the trainer: the fused multi-tensor kernel of kernels/adamw.* on CUDA (ATen reference on CPU),
// global-norm clipping decided on the device, a non-finite guard, decay / no-decay parameter groups, and a
// state that round-trips bit-exactly through a checkpoint.
//
// Defaults are openpi pi05_libero's (spec §9.1): betas (0.9, 0.95), eps 1e-8, weight decay 1e-10 applied to
// every parameter (no mask), global-norm clipping at 1.0 before the update.
//
// One step reads the gradient norm back to the host once, after the update has been queued: the clip
// coefficient min(1, max_norm / (norm + 1e-6)) is computed on the device and multiplied into the gradients inside
// the kernel (no extra pass, no sync before the update), and a non-finite norm makes that coefficient NaN, which
// the kernel reads as "write nothing". The host then sees the norm, reports the step as skipped and does not
// advance the step count.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/adamw.h"
#include "trainer/shard_layout.h"

namespace vlatune::trainer {

// Recipe `model_options.precision`.
enum class OptimizerPrecision {
  kBf16,        // "bf16": AdamW state in the parameters' own dtype (bf16 for the bf16 model, as openpi-PT's
                // torch.optim.AdamW; fp32 for an fp32 model, e.g. the CPU tiny config)
  kFp32Master,  // "fp32-master": fp32 master weights and fp32 state; the bf16 model is the rounded master
};

// "bf16" | "fp32-master"; anything else throws naming the accepted values.
OptimizerPrecision parse_optimizer_precision(const std::string& name);
const char* optimizer_precision_name(OptimizerPrecision precision);

// Recipe `optimizer.state_dtype`: how AdamW's two moments are stored.
enum class OptimizerStateDtype {
  kAuto,           // "auto": the dtype the precision gives (the parameters' dtype for "bf16", fp32 for fp32-master)
  kInt8Blockwise,  // "int8-blockwise": 8-bit codes + an fp32 absmax per 256 elements (kernels/adamw.h), for the
                   // tensors of at least AdamWOptions::int8_min_numel elements; smaller ones keep "auto"
};
OptimizerStateDtype parse_optimizer_state_dtype(const std::string& name);
const char* optimizer_state_dtype_name(OptimizerStateDtype state_dtype);

// Tensors below this many elements keep full-precision moments under int8-blockwise (bitsandbytes' min_8bit_size):
// norms, biases and small heads are a negligible share of the bytes, and a block of a few values gains nothing
// from an absmax of its own.
inline constexpr int64_t kInt8StateMinNumel = 4096;

struct AdamWOptions {
  double lr = 5e-5;  // the rate of step(max_grad_norm) without an explicit lr; the schedule normally passes one
  std::pair<double, double> betas = {0.9, 0.95};
  double eps = 1e-8;
  double weight_decay = 1e-10;
  OptimizerPrecision precision = OptimizerPrecision::kBf16;
  OptimizerStateDtype state_dtype = OptimizerStateDtype::kAuto;
  int64_t int8_min_numel = kInt8StateMinNumel;  // tests lower it to quantize every tensor of the tiny config
  // True for FQNs that get no weight decay (e.g. norms and biases). Empty: every parameter decays (openpi).
  std::function<bool(const std::string& fqn)> no_decay;
};

struct StepResult {
  double grad_norm = 0.0;  // global L2 norm of the gradients before clipping (NaN/inf when skipped)
  double clip_coef = 1.0;  // min(1, max_norm / (norm + 1e-6)): the factor applied to the gradients
  double lr = 0.0;
  bool skipped = false;  // non-finite norm: nothing was updated, the step count did not advance
  int64_t step = 0;      // updates applied so far (after this one)
};

// The optimizer's checkpointable state: named tensors (safetensors) and scalars (JSON).
// Tensor names: "exp_avg.<fqn>", "exp_avg_sq.<fqn>", and with fp32 master weights "master.<fqn>"; with 8-bit state
// exp_avg/exp_avg_sq are uint8 codes and "exp_avg_absmax.<fqn>", "exp_avg_sq_absmax.<fqn>" hold the block scales
// (so the tensors alone say which state dtype wrote them).
// Scalars: "step", "skipped_steps" (restored) and "beta1", "beta2", "eps", "weight_decay" (informative).
struct OptimizerState {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, double> scalars;
  std::string precision;  // optimizer_precision_name()
};

// Where a sharded AdamW (ZeRO-1) reads what lies outside its ranges; trainer/train_step.cpp wires it to the
// gradient buckets (trainer/grad_buckets.h).
struct ShardedGradients {
  // The mean gradient of parameter i's range over the ranks: 1-D, the range's length, fp32 or bf16.
  std::function<torch::Tensor(size_t i)> range_gradient;
  // True when every parameter's .grad holds the whole mean gradient (the buckets all-reduced): the global norm is
  // then taken from them exactly as one unsharded optimizer takes it, bit for bit. False: from this rank's ranges,
  // their squares summed over the ranks by sum_over_ranks (equal to the unsharded norm up to the order of fp32
  // additions).
  bool whole_gradients = false;
  std::function<void(torch::Tensor& sum_of_squares)> sum_over_ranks;  // in place, 0-d fp64 on the device
};

class AdamW {
 public:
  // `named_params`: the trainable parameters (the optimizer updates these tensors in place), all on one device,
  // fp32 or bf16, contiguous. Names must be unique.
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> named_params, AdamWOptions options = {});
  // Sharded over the data-parallel ranks (ZeRO-1, trainer/shard_layout.h): moments and master weights exist, and
  // updates happen, only for ranges[i] of each flattened parameter i (one range per parameter, length 0 for none;
  // a range of a parameter with 8-bit state starts on a 256-value block); gradients and the global norm come from
  // `gradients`. Each update writes this rank's ranges of the parameters: the caller all-gathers them after it.
  // Which state dtype a parameter gets depends on its whole size, as unsharded.
  AdamW(std::vector<std::pair<std::string, torch::Tensor>> named_params, AdamWOptions options,
        std::vector<ParamRange> ranges, ShardedGradients gradients);
  bool sharded() const { return !ranges_.empty(); }

  // Clips to `max_grad_norm` (<= 0: no clipping) and applies one AdamW update at rate `lr`. A parameter without a
  // gradient is updated with a zero gradient (as optax does for the zero gradients of dead parameters).
  StepResult step(double lr, double max_grad_norm);
  StepResult step(double max_grad_norm) { return step(options_.lr, max_grad_norm); }

  // step() in two halves, for a step captured as a CUDA graph (trainer/step_graph.h):
  //   queue_update: the norm, the clip coefficient and the update, queued without a host sync; returns the 0-d
  //     norm tensor on the device. With `device_schedule`, the kernels read the per-step scalars (learning rate,
  //     bias corrections) from a device buffer that write_device_schedule fills, instead of taking them as launch
  //     parameters, so that one capture serves every step; `lr` is then unused.
  //   finish_update: reads the norm (the host sync; or takes it, read by the caller) and advances the step count
  //     unless the update was skipped.
  // step(lr, m) == finish_update(lr, m, queue_update(lr, m, false)).
  // `in_flight_norm` (defined): the norm queue_update returned for the previous update, which finish_update has not
  // taken yet (a loop that queues the next step before it reads the last). Bias corrections count the updates
  // that were not skipped, so this update's depends on whether that norm is finite: on CUDA the device picks
  // between both candidates' scalars (write_device_schedule), on the CPU the norm is read; either way the update
  // is the one a loop that reads every norm first would make.
  torch::Tensor queue_update(double lr, double max_grad_norm, bool device_schedule,
                             const torch::Tensor& in_flight_norm = {});
  StepResult finish_update(double lr, double max_grad_norm, const torch::Tensor& norm);
  StepResult finish_update(double lr, double max_grad_norm, double grad_norm);
  // The device scalars of the next update (step_count() + 1 at `lr`; with `in_flight_norm`, + 2 where that norm is
  // finite), one row per parameter group. Queued on the current stream (from pinned memory); call before the
  // graph that reads them is replayed. The pinned buffers alternate: one is rewritten two calls after its copy was
  // queued, by when the caller has read a norm queued after that copy.
  void write_device_schedule(double lr, const torch::Tensor& in_flight_norm = {});

  // Sets every gradient to none (undefined), as torch's zero_grad(set_to_none=true).
  void zero_grad();

  // Live tensors (no copy): write or clone them before the next step. Unsharded only (std::logic_error otherwise).
  OptimizerState state_dict() const;
  // The whole state of a sharded optimizer, the same tensors as one unsharded optimizer's state_dict() holds:
  // `gather(range, start, numel)` returns the 1-D tensor of `numel` elements whose [start, start + range.numel())
  // is this rank's `range`, assembled from every rank's (a collective: every rank calls state_dict with the same
  // tensors in the same order). Unsharded: state_dict().
  using RangeGather = std::function<torch::Tensor(const torch::Tensor& range, int64_t start, int64_t numel)>;
  OptimizerState state_dict(const RangeGather& gather) const;
  // Restores a whole state_dict() of an optimizer over the same parameters and precision (sharded or not: a
  // sharded optimizer keeps its ranges of it): every tensor must be present with the same shape and dtype (the
  // error names it). The parameters themselves are the model's checkpoint.
  void load_state_dict(const OptimizerState& state);

  // Bytes of the optimizer's own tensors (moments, block scales, master weights) on this rank.
  int64_t state_bytes() const;

  int64_t step_count() const { return step_; }
  int64_t skipped_steps() const { return skipped_; }
  const AdamWOptions& options() const { return options_; }
  size_t size() const { return names_.size(); }
  const std::string& name(size_t i) const { return names_[i]; }
  bool decays(size_t i) const { return decay_[i]; }

 private:
  // The hyperparameters of the next update (step_count() + 1) at `lr`; weight decay is per group.
  kernels::AdamwParams next_update(double lr) const;
  // Parameters updated by one adamw_step (or adamw_step_int8) call: same weight decay, dtype and storage.
  struct Group {
    double weight_decay = 0.0;
    bool int8 = false;
    std::vector<size_t> index;
    std::vector<torch::Tensor> params, exp_avg, exp_avg_sq, master;  // master empty: no master weights
    std::vector<torch::Tensor> exp_avg_absmax, exp_avg_sq_absmax;    // int8 only
  };

  // One state tensor of state_dict(): its local tensor (this rank's range of it when sharded), the whole
  // tensor's shape, and where the local one lies in the whole, flattened.
  struct StateEntry {
    std::string name;
    torch::Tensor local;
    std::vector<int64_t> sizes;
    int64_t start = 0, numel = 0;
  };
  std::vector<StateEntry> state_entries() const;
  void build_groups();

  AdamWOptions options_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;  // what an update writes: the parameters, or their ranges (1-D views)
  std::vector<torch::Tensor> whole_params_;
  std::vector<ParamRange> ranges_;  // empty: unsharded
  ShardedGradients sharded_;
  std::vector<torch::Tensor> exp_avg_, exp_avg_sq_, master_;       // master_[i] undefined: no master for i
  std::vector<torch::Tensor> exp_avg_absmax_, exp_avg_sq_absmax_;  // undefined: full-precision moments for i
  std::vector<bool> decay_;
  std::vector<Group> groups_;
  int64_t step_ = 0;
  int64_t skipped_ = 0;
  torch::Tensor schedule_device_;               // [groups, 3] fp32 (AdamwStepScalars) the kernels read
  torch::Tensor schedule_choices_;              // [2, groups, 3]: previous update skipped / not skipped
  std::array<torch::Tensor, 2> schedule_host_;  // pinned copies of schedule_choices_, used alternately
  int schedule_host_next_ = 0;
};

}  // namespace vlatune::trainer
