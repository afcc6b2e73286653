// Gradient buckets per recipe group (DESIGN.md "groups": a group is the unit of gradient bucketing; its
// all-reduce starts the moment its backward finishes).
//
//   buckets   One coalesced all-reduce per group. When the reduce dtype (recipe distributed.reduce_dtype: bf16 or
//             fp32) is the gradients' dtype, the parameters' own .grad tensors are all-reduced in place (one NCCL
//             group of all-reduces: no copy into a bucket and no bucket memory). Otherwise (bf16 gradients reduced
//             in fp32, or fp32 in bf16) the group's gradients are packed, cast, into one flat buffer in the reduce
//             dtype and cast back after the all-reduce. The path is chosen per group from the parameters' dtypes
//             alone, so every rank issues the same collectives. Before either, a missing gradient is zero-filled
//             and, on the in-place path, a non-contiguous one is replaced by a contiguous copy (NCCL reduces dense
//             tensors). Gradients never overlap, so no memory is reduced twice: AccumulateGrad keeps an incoming
//             gradient only when nothing else references it (else it copies), so two .grad tensors share memory
//             only as disjoint views of one gradient (a cat's backward); the merged QKV / gate+up weights, views of
//             one packed buffer, get separate gradients from kernels/merged_linear_autograd.cpp. Groups are launched in
//             one fixed order on every rank (backward order: heads.out, layer.N-1 .. layer.0, heads.in, vision, then
//             "<rest>" for parameters no group names), so collectives always match across ranks.
//   row-sparse  A parameter in options.row_sparse (the token embedding: its gradient is non-zero only in the rows
//             of the ids looked up this step, the LM head being unused) is reduced apart from its group's other
//             gradients, in the group's launch: a uint8 mask of its non-zero rows, all-reduced with MAX (the union
//             over ranks); at::nonzero_static(union, capacity = world size x max rows per rank, padding index 0);
//             those rows gathered (index_select, in the reduce dtype), all-reduced, and written back by finish()
//             with index_copy_ (padding repeats row 0, with row 0's own value). Rows outside the union are zero on
//             every rank, so their mean is zero and the result is the dense reduction's. Nothing waits on the host:
//             the union's row count stays on the device and is read before the next step's reductions
//             (arm_last_backward, finish) or by check_row_bounds(); a union larger than the capacity (rows were
//             dropped) is a DistributedError naming the parameter. A capacity of half the rows or more is reduced
//             densely.
//   hooks     A post-hook on each parameter's AccumulateGrad node (as DDP's reducer does) marks the parameter
//             ready once its .grad holds the step's gradient. Only the last micro-batch's backward is armed
//             (arm_last_backward). When every parameter of a group is ready and every group before it has been
//             launched, the group's all-reduce starts, asynchronously, while the rest of backward runs. A group
//             that is ready early waits for its predecessors (fixed order); a group some of whose parameters got
//             no gradient on this rank (unused in this batch) is launched by finish(), after the missing gradients
//             were zero-filled.
//   streams   CUDA: the launch zero-fills missing gradients and makes contiguous copies on the compute stream (so
//             the compute stream owns every .grad), then records an event there; a dedicated communication stream
//             waits for it, packs (flat path) or computes the row masks and gathers the rows, and calls c10d,
//             whose NCCL stream waits for the comm stream. The tensors NCCL uses stay alive until finish():
//             .grad by its parameter, buffers, masks, indices and rows by the buckets (ProcessGroupNCCL also keeps
//             the inputs of asynchronous collectives until their wait). finish() makes the comm stream wait for
//             NCCL, completes there (divide by the world size where the backend has no AVG, unpack the flat
//             buffers, write the rows back) and makes the compute stream wait for it before clipping and AdamW;
//             gradients are freed (zero_grad) on the compute stream after that. Between a group's launch and
//             finish() nothing else reads or writes its gradients. CPU (Gloo): the collectives run on Gloo's
//             threads; the row-mask wait blocks the launching thread, finish() waits for the rest.
//   modes     overlap (default) as above, or one bucket after backward (all parameters, one coalesced all-reduce
//             started by finish(): the baseline the overlap is measured against; `vlatune train --dist-buckets
//             one`). The one-bucket mode reduces row-sparse parameters densely, so that it stays one collective.
//   report    groups()[i].bytes: the bytes all-reduced per step (dense gradients in the reduce dtype; a row-sparse
//             parameter as capacity x row bytes plus its uint8 mask), what profile.json's communication section
//             divides by the NCCL time; dense_bytes: what a dense reduction of the group would move.
//   sharded   (options.shard: recipe distributed.shard_optimizer_state, ZeRO-1) The optimizer state is split over
//             the ranks along each group's shard layout (trainer/shard_layout.h); ranges() says which range of each
//             parameter this rank updates. Two reductions:
//               reduce-scatter (NCCL): at its launch the group's gradients are packed, in the reduce dtype, into a
//                 padded buffer of the layout and freed (the packed buffer takes their place until finish()); one
//                 reduce-scatter leaves this rank's shard of the mean in a buffer of 1/world of the group, half an
//                 all-reduce's traffic. Row-sparse parameters are reduced densely here. The .grad tensors stay
//                 undefined: range_gradient() is the mean, and the global norm is summed over the ranks' ranges.
//               all-reduce (Gloo): the unsharded reduction, unchanged: every .grad holds the whole mean and
//                 range_gradient() is a view of it. Gloo's own reduce-scatter is an all-reduce followed by a copy
//                 (the same traffic), and an all-reduce of the unpadded gradients sums every element in the order
//                 the unsharded run sums it, so a sharded run on the CPU equals the unsharded one bit for bit on any
//                 number of ranks (a reduce-scatter of the padded layout changes Gloo's ring segments, hence the
//                 order of the sums over three or more ranks).
//             After the optimizer has updated this rank's ranges, gather_parameters() all-gathers every group's
//             parameters in the layout (one collective per group, on the current stream).
//   profiler  every group's launch runs inside profiler::Scope("<comm>:<group name>") and the final unpack inside
//             profiler::Scope("<comm>"): the attribution tables count both as "<comm>", profile.json's
//             communication section keys NCCL time per group by the name (profiler/comm_stats.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "trainer/distributed.h"
#include "trainer/shard_layout.h"

namespace vlatune::trainer {

// A group before parameters are assigned: its recipe name and module FQNs (resolved, not patterns).
struct GroupModules {
  std::string name;
  std::vector<std::string> modules;
};

// The default grouping of DESIGN.md, one group per named unit, in backward order, over the model's module FQNs
// (layout/pi05.h group_pieces, merged by unit).
std::vector<GroupModules> default_group_modules(const std::vector<std::string>& module_fqns);

// Recipe groups (any order) sorted into backward order: by the forward position of each group's last module,
// latest first (layout/pi05.h forward_order_key).
std::vector<GroupModules> backward_ordered(std::vector<GroupModules> groups);

struct BucketAssignment {
  std::string name;
  std::vector<size_t> params;  // indices into the named parameter list, in that list's order
};

// Assigns each parameter to the group whose module contains it. Parameters of no group go to a last group
// "<rest>". A parameter inside two groups: std::invalid_argument naming both.
std::vector<BucketAssignment> assign_parameters(const std::vector<std::string>& param_names,
                                                const std::vector<GroupModules>& groups);

// A parameter whose gradient is non-zero in at most `max_rows_per_rank` rows (dim 0) on each rank, every step.
struct RowSparseParam {
  size_t param = 0;  // index into the named parameter list
  int64_t max_rows_per_rank = 0;
};

// How a sharded step reduces the gradients (grad_buckets.h "sharded").
enum class ShardReduction {
  kAuto,           // reduce-scatter on NCCL, all-reduce on Gloo
  kReduceScatter,  // each rank receives its shard of the mean
  kAllReduce,      // every rank receives the whole mean
};

struct GradBucketsOptions {
  bool reduce_fp32 = false;                // false: reduced in bf16
  bool overlap = true;                     // false: one bucket, reduced after backward
  std::vector<RowSparseParam> row_sparse;  // ignored (dense) when !overlap or under a reduce-scatter
  bool shard = false;                      // optimizer state sharded over the ranks (ZeRO-1)
  ShardReduction shard_reduction = ShardReduction::kAuto;
};

class GradBuckets {
 public:
  struct Group {
    std::string name;
    std::vector<size_t> params;
    int64_t numel = 0;
    int64_t bytes = 0;        // all-reduced per step: dense part x reduce dtype size + row-sparse capacity and masks
    int64_t dense_bytes = 0;  // numel x element size of the reduce dtype
    bool in_place = false;    // the .grad tensors themselves are all-reduced (reduce dtype == gradient dtype)
    std::vector<size_t> row_sparse;  // parameters (of `params`) reduced by rows
    ShardLayout shard;               // sharded: `params` in the shard layout (offsets per entry of `params`)
  };

  // `named_params`: the trainer's list (names and tensors stay valid for the buckets' lifetime).
  GradBuckets(std::shared_ptr<ProcessGroup> pg, const std::vector<std::pair<std::string, at::Tensor>>& named_params,
              const std::vector<BucketAssignment>& groups, const GradBucketsOptions& options);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // The next backward is the step's last (gradient accumulation): its ready parameters launch reductions.
  void arm_last_backward();
  // After the last backward (and any zero-filling of missing gradients): launches the groups not launched yet,
  // waits for all, and leaves every .grad holding the average over ranks. Throws DistributedError (also for the
  // previous step's row bound, see check_row_bounds).
  void finish();
  // Whether the last reduced step's row-sparse gradients fitted their capacity (read from the device, where the
  // count was left to avoid a host synchronization in the step): DistributedError naming the parameter, the
  // count and the capacity otherwise. Runs by itself before the next step's reductions; call it after the last
  // step. Every rank reads the same count, so every rank throws.
  void check_row_bounds();

  const std::vector<Group>& groups() const;
  int world_size() const;

  // Sharded (options.shard). Per parameter of the named list: the range of it this rank updates (the whole
  // parameter for one outside every group).
  const std::vector<ParamRange>& ranges() const;
  // Whether finish() leaves the whole mean in every .grad (all-reduce) or only this rank's ranges (reduce-scatter).
  bool whole_gradients() const;
  // After finish(), until the next step's reductions start: the mean gradient of parameter p's range, 1-D (the
  // reduce dtype under a reduce-scatter, else the .grad's dtype).
  at::Tensor range_gradient(size_t p) const;
  // After this rank's ranges were updated: every group's parameters all-gathered from the ranks that own them.
  void gather_parameters();
  // Groups whose all-reduce started during the last step's backward (the rest started in finish()).
  int launched_during_backward() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace vlatune::trainer
