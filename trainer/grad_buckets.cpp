#include "trainer/grad_buckets.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#ifdef VLATUNE_HAVE_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "formats/fqn_pattern.h"
#include "layout/pi05.h"
#include "profiler/scope.h"

namespace vlatune::trainer {

namespace {
const std::string kCommScopeName = profiler::kCommScope;  // scopes keep a reference to their name
}  // namespace

std::vector<GroupModules> default_group_modules(const std::vector<std::string>& module_fqns) {
  std::vector<GroupModules> out;
  for (const layout::GroupPiece& piece : layout::group_pieces(module_fqns)) {
    if (out.empty() || out.back().name != piece.unit) out.push_back({piece.unit, {}});
    out.back().modules.insert(out.back().modules.end(), piece.roots.begin(), piece.roots.end());
  }
  return out;
}

std::vector<GroupModules> backward_ordered(std::vector<GroupModules> groups) {
  auto last_key = [](const GroupModules& g) {
    std::vector<long> best;
    for (const std::string& m : g.modules) best = std::max(best, layout::forward_order_key(m));
    return best;
  };
  std::stable_sort(groups.begin(), groups.end(),
                   [&](const GroupModules& a, const GroupModules& b) { return last_key(a) > last_key(b); });
  return groups;
}

std::vector<BucketAssignment> assign_parameters(const std::vector<std::string>& param_names,
                                                const std::vector<GroupModules>& groups) {
  std::vector<BucketAssignment> out;
  for (const GroupModules& g : groups) out.push_back({g.name, {}});
  BucketAssignment rest{"<rest>", {}};
  for (size_t p = 0; p < param_names.size(); ++p) {
    int owner = -1;
    for (size_t g = 0; g < groups.size(); ++g) {
      const bool inside = formats::fqn_within_any(param_names[p], groups[g].modules);
      if (!inside) continue;
      if (owner >= 0)
        throw std::invalid_argument("parameter " + param_names[p] + " is in two groups: '" + groups[owner].name +
                                    "' and '" + groups[g].name + "'");
      owner = static_cast<int>(g);
    }
    (owner >= 0 ? out[static_cast<size_t>(owner)] : rest).params.push_back(p);
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const BucketAssignment& b) { return b.params.empty(); }),
            out.end());
  if (!rest.params.empty()) out.push_back(std::move(rest));
  return out;
}

struct GradBuckets::State {
  // A row-sparse parameter (grad_buckets.h "row-sparse").
  struct RowSparse {
    size_t param = 0;
    int64_t max_rows_per_rank = 0;
    int64_t rows = 0, row_numel = 0;
    int64_t capacity = 0;  // rows gathered per step: world size x max_rows_per_rank
    // Per step, on the comm stream: the union of non-zero rows (uint8 per row), its indices padded with 0, those
    // rows' gradients in the reduce dtype, and their all-reduce.
    at::Tensor mask, index, values;
    std::unique_ptr<ProcessGroup::Pending> pending;
    // The union's row count of the last reduced step, read by check_row_bounds: a CPU tensor (pinned on CUDA,
    // filled asynchronously; count_ready says when).
    at::Tensor count;
    bool unchecked = false;
#ifdef VLATUNE_HAVE_NCCL
    std::optional<at::cuda::CUDAEvent> count_ready;
#endif
  };

  std::shared_ptr<ProcessGroup> pg;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<Group> groups;
  // Per group: the scope its all-reduce is launched in, "<comm>:name" (profiler/comm_stats.h comm_scope_name), so
  // the profiler keys NCCL time by group; the attribution tables count it as "<comm>".
  std::vector<std::string> scope_names;
  std::vector<std::vector<size_t>> dense;  // per group: its parameters reduced whole (all but the row-sparse ones)
  std::vector<at::Tensor> flat;            // per group: the buffer in the reduce dtype (undefined when in place)
  std::vector<int64_t> offset;             // per parameter: its offset in its group's buffer
  std::vector<size_t> group_of;            // per parameter
  std::vector<RowSparse> row_sparse;
  std::vector<std::vector<size_t>> row_sparse_of;  // per group: indices into row_sparse
  std::vector<char> is_row_sparse;                 // per parameter
  at::ScalarType reduce_dtype = at::kBFloat16;
  GradBucketsOptions options;
  bool cuda = false;
  // Sharded (grad_buckets.h "sharded").
  bool scatter = false;                   // reduced by reduce-scatter
  std::vector<ParamRange> ranges;         // per parameter: this rank's
  std::vector<char> in_group;             // per parameter
  std::vector<int64_t> layout_offset;     // per parameter: its first element in its group's shard layout
  std::vector<at::Tensor> shard_grad;     // per group (scatter): this rank's shard of the mean, in the reduce dtype
  std::vector<at::Tensor> scatter_input;  // per group (scatter), per step: the packed gradients

  // Per step.
  std::mutex mutex;
  bool armed = false;
  std::vector<char> seen;     // per parameter
  std::vector<size_t> ready;  // per group: expected parameters seen
  // Parameters that get a gradient: all until the first step's backward has shown which do (on any rank; e.g.
  // the prefix branch's final norm never does). A group is ready when its expected parameters are.
  std::vector<char> expected;          // per parameter
  std::vector<size_t> expected_count;  // per group
  bool calibrated = false;
  std::optional<size_t> late;  // an unexpected parameter whose gradient came after its group was launched
  size_t next_launch = 0;      // groups [0, next_launch) are launched
  int launched_in_backward = 0, last_launched_in_backward = 0;
  std::vector<std::unique_ptr<ProcessGroup::Pending>> pending;  // per group: its dense part's all-reduce
  std::vector<std::vector<at::Tensor>> in_place;                // per group: the gradients reduced in place

  // AccumulateGrad nodes are owned by their parameter only through a weak pointer: keep them alive so that the
  // hooks stay attached (DDP's reducer does the same).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;

#ifdef VLATUNE_HAVE_NCCL
  std::optional<c10::cuda::CUDAStream> comm_stream;
#endif

  std::string what(size_t g) const {
    return "all-reduce of gradient group '" + groups[g].name + "'";
  }

  // The mean over ranks: NCCL averages inside the collective (ReduceOp::AVG); Gloo sums, and complete_mean divides
  // once the collective has finished.
  std::unique_ptr<ProcessGroup::Pending> start_mean(at::Tensor& t, const std::string& what) {
    return pg->supports_average() ? pg->allreduce_average(t, what) : pg->allreduce_sum(t, what);
  }
  std::unique_ptr<ProcessGroup::Pending> start_mean(std::vector<at::Tensor>& ts, const std::string& what) {
    return pg->supports_average() ? pg->allreduce_coalesced_average(ts, what) : pg->allreduce_coalesced_sum(ts, what);
  }
  void complete_mean(at::Tensor& t) const {
    if (!pg->supports_average()) t.div_(static_cast<double>(pg->size()));
  }

  // On the launching thread's current stream (CUDA: the compute stream, which then owns every .grad it frees
  // after the optimizer): a missing gradient becomes zeros, and one NCCL would reduce in place (in-place groups,
  // row-sparse parameters) becomes contiguous.
  void prepare_grads(size_t g) {
    for (size_t p : groups[g].params) {
      at::Tensor& grad = params[p].mutable_grad();
      if (!grad.defined())
        grad = at::zeros_like(params[p], at::MemoryFormat::Contiguous);
      else if ((groups[g].in_place || is_row_sparse[p]) && !grad.is_contiguous())
        grad = grad.contiguous();
    }
  }

  at::Tensor rows_of(const RowSparse& r) const {
    return params[r.param].grad().view({r.rows, r.row_numel});
  }

  // The union of the rows that are non-zero on any rank (any() reads the gradient once, no temporary of its size).
  std::unique_ptr<ProcessGroup::Pending> start_row_mask(RowSparse& r) {
    r.mask = at::any(rows_of(r), /*dim=*/1).to(at::kByte);
    return pg->allreduce_max(r.mask, "all-reduce of the non-zero rows of " + names[r.param]);
  }

  // After the mask's all-reduce (the current stream waited for it): the union's rows, gathered and all-reduced.
  void start_rows(RowSparse& r) {
    const at::Tensor union_rows = r.mask.sum();  // int64, stays on the device
#ifdef VLATUNE_HAVE_NCCL
    if (cuda) {
      if (!r.count.defined()) r.count = at::empty({}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
      r.count.copy_(union_rows, /*non_blocking=*/true);
      if (!r.count_ready) r.count_ready.emplace();
      r.count_ready->record(c10::cuda::getCurrentCUDAStream(union_rows.device().index()));
    } else {
      r.count = union_rows;
    }
#else
    r.count = union_rows;
#endif
    r.unchecked = true;
    // Past the union's size nonzero_static pads with row 0: gathered, reduced and written back with its own value.
    r.index = at::nonzero_static(r.mask, r.capacity, /*fill_value=*/0).view({r.capacity});
    at::Tensor values = rows_of(r).index_select(0, r.index);
    r.values = values.scalar_type() == reduce_dtype ? values : values.to(reduce_dtype);
    const std::string what = "all-reduce of the non-zero rows' gradients of " + names[r.param];
    r.pending = start_mean(r.values, what);
  }

  void finish_rows(RowSparse& r) {
    r.pending->wait();
    complete_mean(r.values);
    at::Tensor grad_rows = rows_of(r);
    grad_rows.index_copy_(
        0, r.index,
        r.values.scalar_type() == grad_rows.scalar_type() ? r.values : r.values.to(grad_rows.scalar_type()));
  }

  void pack(size_t g) {
    for (size_t p : dense[g]) {
      const at::Tensor& param = params[p];
      flat[g].narrow(0, offset[p], param.numel()).view(param.sizes()).copy_(param.grad());
    }
  }

  void unpack(size_t g) {
    complete_mean(flat[g]);
    for (size_t p : dense[g]) {
      at::Tensor& param = params[p];
      param.mutable_grad().copy_(flat[g].narrow(0, offset[p], param.numel()).view(param.sizes()));
    }
  }

  // The gradient was packed on the comm stream: its memory may be reused once that stream has read it.
  void release_grad(size_t p) {
    at::Tensor& grad = params[p].mutable_grad();
#ifdef VLATUNE_HAVE_NCCL
    if (cuda) c10::cuda::CUDACachingAllocator::recordStream(grad.storage().data_ptr(), *comm_stream);
#endif
    grad.reset();
  }

  void start_scatter(size_t g) {
    const ShardLayout& layout = groups[g].shard;
    at::Tensor input = at::zeros({layout.padded_numel}, params[dense[g].front()].options().dtype(reduce_dtype));
    for (size_t p : dense[g]) {
      const at::Tensor& param = params[p];
      input.narrow(0, layout_offset[p], param.numel()).view(param.sizes()).copy_(param.grad());
      release_grad(p);
    }
    scatter_input[g] = input;
    pending[g] = pg->reduce_scatter(shard_grad[g], scatter_input[g], pg->supports_average(),
                                    "reduce-scatter of gradient group '" + groups[g].name + "'");
  }

  void start_dense(size_t g) {
    if (dense[g].empty()) return;
    if (scatter) {
      start_scatter(g);
      return;
    }
    if (!groups[g].in_place) {
      pack(g);
      pending[g] = start_mean(flat[g], what(g));
      return;
    }
    in_place[g].clear();
    for (size_t p : dense[g]) in_place[g].push_back(params[p].grad());
    pending[g] = start_mean(in_place[g], what(g));
  }

  void finish_dense(size_t g) {
    if (!pending[g]) return;
    pending[g]->wait();  // NCCL: the current stream waits for NCCL's
    if (scatter) {
      complete_mean(shard_grad[g]);
    } else if (!groups[g].in_place) {
      unpack(g);
    } else {
      for (at::Tensor& grad : in_place[g]) complete_mean(grad);
    }
  }

  // On the comm stream (CUDA). The row masks go first (small), then the dense part, then the rows once the masks'
  // union is known: the comm stream gathers the rows while NCCL reduces the dense part.
  void start_reductions(size_t g) {
    std::vector<std::unique_ptr<ProcessGroup::Pending>> masks;
    for (size_t r : row_sparse_of[g]) masks.push_back(start_row_mask(row_sparse[r]));
    start_dense(g);
    for (size_t i = 0; i < masks.size(); ++i) {
      masks[i]->wait();  // NCCL: the comm stream waits (no host synchronization); Gloo: the host waits
      start_rows(row_sparse[row_sparse_of[g][i]]);
    }
  }

  // Caller holds `mutex`.
  void launch(size_t g, bool in_backward) {
    profiler::Scope scope(scope_names[g], in_backward ? profiler::Phase::kBackward : profiler::Phase::kOther);
    prepare_grads(g);
#ifdef VLATUNE_HAVE_NCCL
    if (cuda) {
      // The hook runs on the autograd device thread, whose current stream is the one backward computes on.
      const c10::DeviceIndex index = params[groups[g].params.front()].device().index();
      at::cuda::CUDAEvent grads_ready;
      grads_ready.record(c10::cuda::getCurrentCUDAStream(index));
      grads_ready.block(*comm_stream);
      c10::cuda::CUDAStreamGuard on_comm(*comm_stream);
      start_reductions(g);
      if (in_backward) ++launched_in_backward;
      return;
    }
#endif
    start_reductions(g);
    if (in_backward) ++launched_in_backward;
  }

  // Caller holds `mutex`. Each recorded count is read before the next step records another.
  void check_row_bounds() {
    for (RowSparse& r : row_sparse) {
      if (!r.unchecked) continue;
      r.unchecked = false;
#ifdef VLATUNE_HAVE_NCCL
      if (r.count_ready) r.count_ready->synchronize();  // recorded a step ago: long complete
#endif
      const int64_t union_rows = r.count.item<int64_t>();
      if (union_rows > r.capacity)
        throw DistributedError("distributed: the row-sparse gradient of " + names[r.param] + " had " +
                               std::to_string(union_rows) + " non-zero rows over the ranks, more than its capacity " +
                               std::to_string(r.capacity) + " (" + std::to_string(pg->size()) + " ranks x " +
                               std::to_string(r.max_rows_per_rank) +
                               " rows per rank): rows were dropped from its all-reduce, so the ranks' gradients "
                               "differ; the rows-per-rank bound given to the gradient buckets is too small");
    }
  }

  // After the first armed step: which parameters got a gradient on any rank (one extra all-reduce, once).
  // Later: an unexpected gradient that came after its group was reduced would be lost, so the run stops.
  void after_step() {
    if (late) {
      throw DistributedError("distributed: parameter " + names[*late] + " (group '" + groups[group_of[*late]].name +
                             "') received a gradient although it had none in the first step, after its group was "
                             "all-reduced; run with --dist-buckets one for models whose used parameters change "
                             "from step to step");
    }
    if (calibrated || !options.overlap) return;
    std::vector<float> seen_mask(params.size());
    for (size_t p = 0; p < params.size(); ++p) seen_mask[p] = seen[p] ? 1.0f : 0.0f;
    at::Tensor on_device = at::tensor(seen_mask, at::kFloat).to(params.front().device());
    pg->allreduce_sum_blocking(on_device, "all-reduce of the parameters that receive gradients");
    const at::Tensor mask = on_device.cpu();
    const float* used = mask.data_ptr<float>();
    std::fill(expected_count.begin(), expected_count.end(), 0);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t p : groups[g].params) {
        expected[p] = used[p] > 0 ? 1 : 0;
        expected_count[g] += expected[p];
      }
    }
    calibrated = true;
  }

  void on_ready(size_t p) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed || seen[p]) return;
    seen[p] = 1;
    const size_t g = group_of[p];
    if (!expected[p]) {
      if (g < next_launch && !late) late = p;
      return;
    }
    ++ready[g];
    // Launch in the fixed order: this group and any ready ones after it, once their predecessors are launched.
    while (next_launch < groups.size() && ready[next_launch] == expected_count[next_launch]) {
      launch(next_launch, /*in_backward=*/true);
      ++next_launch;
    }
  }
};

namespace {

class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<GradBuckets::State> state, size_t param) : state_(std::move(state)), param_(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto state = state_.lock()) state->on_ready(param_);
    return outputs;
  }

 private:
  std::weak_ptr<GradBuckets::State> state_;
  size_t param_;
};

}  // namespace

GradBuckets::GradBuckets(std::shared_ptr<ProcessGroup> pg,
                         const std::vector<std::pair<std::string, at::Tensor>>& named_params,
                         const std::vector<BucketAssignment>& groups, const GradBucketsOptions& options)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.pg = std::move(pg);
  s.options = options;
  for (const auto& item : named_params) {
    s.names.push_back(item.first);
    s.params.push_back(item.second);
  }
  if (s.params.empty()) throw std::invalid_argument("gradient buckets: the model has no parameters");
  s.cuda = s.params.front().is_cuda();
  s.offset.assign(s.params.size(), 0);
  s.group_of.assign(s.params.size(), 0);
  s.reduce_dtype = options.reduce_fp32 ? at::kFloat : at::kBFloat16;
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(s.reduce_dtype));

  // Row-sparse parameters, unless their capacity is half their rows or more (then dense is no more traffic).
  std::vector<int64_t> max_rows(s.params.size(), 0);
  s.scatter = options.shard && (options.shard_reduction == ShardReduction::kReduceScatter ||
                                (options.shard_reduction == ShardReduction::kAuto && s.pg->backend_name() == "nccl"));
  s.in_group.assign(s.params.size(), 0);
  s.layout_offset.assign(s.params.size(), 0);
  for (const at::Tensor& param : s.params) s.ranges.push_back({0, param.numel()});
  if (options.overlap && !s.scatter) {
    for (const RowSparseParam& r : options.row_sparse) {
      if (r.param >= s.params.size() || max_rows[r.param] != 0)
        throw std::invalid_argument("gradient buckets: row-sparse parameter index " + std::to_string(r.param) +
                                    " given twice or out of range");
      const at::Tensor& param = s.params[r.param];
      if (r.max_rows_per_rank < 1 || param.dim() < 1 || param.numel() == 0 || !param.requires_grad())
        throw std::invalid_argument("gradient buckets: row-sparse parameter " + s.names[r.param] +
                                    " needs rows (dim 0), a gradient and max rows per rank >= 1, got " +
                                    std::to_string(r.max_rows_per_rank));
      max_rows[r.param] = r.max_rows_per_rank;
    }
  }
  s.is_row_sparse.assign(s.params.size(), 0);

  std::vector<BucketAssignment> layout = groups;
  if (!options.overlap) {  // one bucket: every parameter, in list order
    BucketAssignment all{"<all>", {}};
    for (size_t p = 0; p < s.params.size(); ++p) all.params.push_back(p);
    layout = {all};
  }
  std::vector<char> assigned(s.params.size(), 0);
  for (const BucketAssignment& b : layout) {
    Group group;
    group.name = b.name;
    std::vector<size_t> dense;
    std::vector<size_t> sparse;
    int64_t dense_numel = 0;
    for (size_t p : b.params) {
      if (p >= s.params.size() || assigned[p])
        throw std::invalid_argument("gradient buckets: parameter index " + std::to_string(p) +
                                    " assigned twice or out of range");
      assigned[p] = 1;
      const at::Tensor& param = s.params[p];
      if (!param.requires_grad()) continue;
      s.group_of[p] = s.groups.size();
      group.numel += param.numel();
      group.params.push_back(p);
      const int64_t rows = param.dim() >= 1 ? param.size(0) : 0;
      const int64_t capacity = max_rows[p] * s.pg->size();
      if (max_rows[p] > 0 && 2 * capacity < rows) {
        State::RowSparse r;
        r.param = p;
        r.max_rows_per_rank = max_rows[p];
        r.rows = rows;
        r.row_numel = param.numel() / rows;
        r.capacity = capacity;
        sparse.push_back(s.row_sparse.size());
        s.row_sparse.push_back(std::move(r));
        s.is_row_sparse[p] = 1;
        group.row_sparse.push_back(p);
        group.bytes += capacity * (param.numel() / rows) * element_bytes + rows;  // the rows, and the uint8 mask
      } else {
        s.offset[p] = dense_numel;
        dense_numel += param.numel();
        dense.push_back(p);
      }
    }
    if (group.params.empty()) continue;
    group.dense_bytes = group.numel * element_bytes;
    group.bytes += dense_numel * element_bytes;
    // In place when every dense gradient already has the reduce dtype (a gradient has its parameter's dtype).
    group.in_place = !s.scatter && std::all_of(dense.begin(), dense.end(),
                                               [&](size_t p) { return s.params[p].scalar_type() == s.reduce_dtype; });
    if (options.shard) {
      std::vector<int64_t> numels;
      for (size_t p : group.params) {
        if (s.params[p].scalar_type() != s.params[group.params.front()].scalar_type())
          throw std::invalid_argument("gradient buckets: group '" + group.name + "' mixes parameter dtypes (" +
                                      s.names[p] + "): its sharded parameters are gathered in one dtype");
        numels.push_back(s.params[p].numel());
      }
      group.shard = shard_layout(numels, s.pg->size());
      for (size_t i = 0; i < group.params.size(); ++i) {
        const size_t p = group.params[i];
        s.in_group[p] = 1;
        s.layout_offset[p] = group.shard.offset[i];
        s.ranges[p] = shard_range(group.shard, i, numels[i], s.pg->rank());
      }
      s.shard_grad.push_back(s.scatter ? at::zeros({group.shard.shard_numel},
                                                   s.params[group.params.front()].options().dtype(s.reduce_dtype))
                                       : at::Tensor());
    }
    s.flat.push_back(group.in_place || dense.empty() || s.scatter
                         ? at::Tensor()
                         : at::zeros({dense_numel}, s.params[dense.front()].options().dtype(s.reduce_dtype)));
    s.dense.push_back(std::move(dense));
    s.row_sparse_of.push_back(std::move(sparse));
    s.scope_names.push_back(kCommScopeName + ":" + group.name);
    s.groups.push_back(std::move(group));
  }
  for (size_t p = 0; p < s.params.size(); ++p)
    if (!assigned[p] && s.params[p].requires_grad())
      throw std::invalid_argument("gradient buckets: parameter " + named_params[p].first + " is in no group");
  s.seen.assign(s.params.size(), 0);
  s.ready.assign(s.groups.size(), 0);
  s.expected.assign(s.params.size(), 1);
  for (const Group& group : s.groups) s.expected_count.push_back(group.params.size());
  s.pending.resize(s.groups.size());
  s.in_place.resize(s.groups.size());
  s.scatter_input.resize(s.groups.size());

#ifdef VLATUNE_HAVE_NCCL
  if (s.cuda) s.comm_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, s.params.front().device().index());
#endif

  if (options.overlap) {
    for (const Group& group : s.groups) {
      for (size_t p : group.params) {
        std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(s.params[p]);
        if (!acc)
          throw std::invalid_argument("gradient buckets: parameter " + named_params[p].first + " is not a leaf");
        s.hook_keys.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(state_, p)));
        s.accumulators.push_back(std::move(acc));
      }
    }
  }
}

GradBuckets::~GradBuckets() {
  State& s = *state_;
  for (size_t i = 0; i < s.accumulators.size(); ++i) s.accumulators[i]->del_post_hook(s.hook_keys[i]);
}

void GradBuckets::arm_last_backward() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->check_row_bounds();  // before this step's reductions record new counts
  state_->armed = state_->options.overlap;
}

void GradBuckets::check_row_bounds() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->check_row_bounds();
}

void GradBuckets::finish() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.armed = false;
  // Whatever the rank's outcome, the per-step state is reset (an exception here ends the run anyway).
  struct Reset {
    State& s;
    ~Reset() {
      std::fill(s.seen.begin(), s.seen.end(), 0);
      std::fill(s.ready.begin(), s.ready.end(), 0);
      for (auto& p : s.pending) p.reset();
      for (auto& grads : s.in_place) grads.clear();
      for (auto& input : s.scatter_input) input = at::Tensor();
      for (auto& r : s.row_sparse) {
        r.pending.reset();
        r.mask = r.index = r.values = at::Tensor();
      }
      s.next_launch = 0;
      s.late.reset();
      s.last_launched_in_backward = s.launched_in_backward;
      s.launched_in_backward = 0;
    }
  } reset{s};
  if (s.next_launch == 0) s.check_row_bounds();  // no group of this step launched yet (not armed)
  for (; s.next_launch < s.groups.size(); ++s.next_launch) s.launch(s.next_launch, /*in_backward=*/false);

  profiler::Scope scope(kCommScopeName, profiler::Phase::kOther);
  auto complete = [&] {
    for (size_t g = 0; g < s.groups.size(); ++g) {
      s.finish_dense(g);
      for (size_t r : s.row_sparse_of[g]) s.finish_rows(s.row_sparse[r]);
    }
  };
#ifdef VLATUNE_HAVE_NCCL
  if (s.cuda) {
    const c10::DeviceIndex index = s.params.front().device().index();
    {
      c10::cuda::CUDAStreamGuard on_comm(*s.comm_stream);
      complete();  // the comm stream waits for NCCL's, then divides, unpacks and writes rows back
    }
    at::cuda::CUDAEvent reduced;
    reduced.record(*s.comm_stream);
    reduced.block(c10::cuda::getCurrentCUDAStream(index));
    s.after_step();
    return;
  }
#endif
  complete();
  s.after_step();
}

const std::vector<GradBuckets::Group>& GradBuckets::groups() const {
  return state_->groups;
}

int GradBuckets::world_size() const {
  return state_->pg->size();
}

int GradBuckets::launched_during_backward() const {
  return state_->last_launched_in_backward;
}

const std::vector<ParamRange>& GradBuckets::ranges() const {
  return state_->ranges;
}

bool GradBuckets::whole_gradients() const {
  return !state_->scatter;
}

at::Tensor GradBuckets::range_gradient(size_t p) const {
  const State& s = *state_;
  const ParamRange r = s.ranges.at(p);
  if (s.scatter && s.in_group[p]) {
    const Group& group = s.groups[s.group_of[p]];
    const int64_t in_shard = s.layout_offset[p] + r.start - s.pg->rank() * group.shard.shard_numel;
    return s.shard_grad[s.group_of[p]].narrow(0, in_shard, r.length);
  }
  const at::Tensor& grad = s.params[p].grad();
  if (!grad.defined()) return at::zeros({r.length}, s.params[p].options());  // a parameter outside every group
  return grad.reshape({-1}).narrow(0, r.start, r.length);
}

void GradBuckets::gather_parameters() {
  State& s = *state_;
  if (!s.options.shard) throw std::logic_error("GradBuckets::gather_parameters: the buckets are not sharded");
  profiler::Scope scope(kCommScopeName, profiler::Phase::kOther);
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const Group& group = s.groups[g];
    const at::TensorOptions options = s.params[group.params.front()].options();
    const int64_t base = s.pg->rank() * group.shard.shard_numel;
    at::Tensor mine = at::zeros({group.shard.shard_numel}, options);
    for (size_t p : group.params) {
      const ParamRange r = s.ranges[p];
      if (r.length > 0)
        mine.narrow(0, s.layout_offset[p] + r.start - base, r.length)
            .copy_(s.params[p].detach().view({-1}).narrow(0, r.start, r.length));
    }
    at::Tensor all = at::empty({group.shard.padded_numel}, options);
    s.pg->allgather(all, mine, "all-gather of the parameters of group '" + group.name + "'")->wait();
    for (size_t p : group.params) {
      at::Tensor param = s.params[p].detach();
      param.view({-1}).copy_(all.narrow(0, s.layout_offset[p], param.numel()));
    }
  }
}

}  // namespace vlatune::trainer
