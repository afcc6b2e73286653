// Gradient buckets per recipe group (DESIGN.md "groups": a group is the unit of gradient bucketing; its
// all-reduce starts the moment its backward finishes).
//
//   buckets   One flat buffer per group, in the reduce dtype (recipe distributed.reduce_dtype: bf16 or fp32),
//             holding the group's parameters' gradients back to back. Groups are launched in one fixed order
//             on every rank (backward order: heads.out, layer.N-1 .. layer.0, heads.in, vision, then "<rest>"
//             for parameters no group names), so collectives always match across ranks.
//   hooks     A post-hook on each parameter's AccumulateGrad node (as DDP's reducer does) marks the parameter
//             ready once its .grad holds the step's gradient. Only the last micro-batch's backward is armed
//             (arm_last_backward). When every parameter of a group is ready and every group before it has been
//             launched, the group is packed into its buffer and its all-reduce starts, asynchronously, while
//             the rest of backward runs. A group that is ready early waits for its predecessors (fixed order);
//             a group some of whose parameters got no gradient on this rank (unused in this batch) is launched
//             by finish(), after the missing gradients were zero-filled.
//   streams   CUDA: packing and the collective are enqueued on a dedicated communication stream that first waits
//             for an event recorded on the compute stream at the hook (so the gradients are complete); NCCL runs
//             on its own stream synchronized with that one. finish() makes the comm stream wait for NCCL, unpacks
//             (average: divide by the world size, cast back into .grad) there, and makes the compute stream wait
//             for it before clipping and AdamW. CPU (Gloo): the collective runs on Gloo's threads; finish() waits.
//   modes     overlap (default) as above, or one bucket after backward (all parameters, one all-reduce started by
//             finish(): the baseline the overlap is measured against; `vlatune train --dist-buckets one`).
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

namespace vlatune::trainer {

// A group before parameters are assigned: its recipe name and module FQNs (resolved, not patterns).
struct GroupModules {
  std::string name;
  std::vector<std::string> modules;
};

// The default grouping of DESIGN.md, one group per named unit, in backward order, over the model's module FQNs
// (tuner/pi05_layout.h group_pieces, merged by unit).
std::vector<GroupModules> default_group_modules(const std::vector<std::string>& module_fqns);

// Recipe groups (any order) sorted into backward order: by the forward position of each group's last module,
// latest first (tuner/pi05_layout.h forward_order_key).
std::vector<GroupModules> backward_ordered(std::vector<GroupModules> groups);

struct BucketAssignment {
  std::string name;
  std::vector<size_t> params;  // indices into the named parameter list, in that list's order
};

// Assigns each parameter to the group whose module contains it. Parameters of no group go to a last group
// "<rest>". A parameter inside two groups: std::invalid_argument naming both.
std::vector<BucketAssignment> assign_parameters(const std::vector<std::string>& param_names,
                                                const std::vector<GroupModules>& groups);

struct GradBucketsOptions {
  bool reduce_fp32 = false;  // false: bf16 buffers
  bool overlap = true;       // false: one bucket, reduced after backward
};

class GradBuckets {
 public:
  struct Group {
    std::string name;
    std::vector<size_t> params;
    int64_t numel = 0;
    int64_t bytes = 0;  // numel x element size of the reduce dtype
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
  // waits for all, and leaves every .grad holding the average over ranks. Throws DistributedError.
  void finish();

  const std::vector<Group>& groups() const;
  int world_size() const;
  // Groups whose all-reduce started during the last step's backward (the rest started in finish()).
  int launched_during_backward() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace vlatune::trainer
