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
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "profiler/scope.h"
#include "tuner/pi05_layout.h"

namespace vlatune::trainer {

namespace {
const std::string kCommScopeName = profiler::kCommScope;  // scopes keep a reference to their name
}  // namespace

std::vector<GroupModules> default_group_modules(const std::vector<std::string>& module_fqns) {
  std::vector<GroupModules> out;
  for (const tuner::GroupPiece& piece : tuner::group_pieces(module_fqns)) {
    if (out.empty() || out.back().name != piece.unit) out.push_back({piece.unit, {}});
    out.back().modules.insert(out.back().modules.end(), piece.roots.begin(), piece.roots.end());
  }
  return out;
}

std::vector<GroupModules> backward_ordered(std::vector<GroupModules> groups) {
  auto last_key = [](const GroupModules& g) {
    std::vector<long> best;
    for (const std::string& m : g.modules) best = std::max(best, tuner::forward_order_key(m));
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
      const bool inside = std::any_of(groups[g].modules.begin(), groups[g].modules.end(),
                                      [&](const std::string& m) { return tuner::fqn_within(param_names[p], m); });
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
  std::shared_ptr<ProcessGroup> pg;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<Group> groups;
  // Per group: the scope its all-reduce is launched in, "<comm>:name" (profiler/comm_stats.h comm_scope_name), so
  // the profiler keys NCCL time by group; the attribution tables count it as "<comm>".
  std::vector<std::string> scope_names;
  std::vector<at::Tensor> flat;  // one buffer per group, in the reduce dtype
  std::vector<int64_t> offset;   // per parameter: its offset in its group's buffer
  std::vector<size_t> group_of;  // per parameter
  GradBucketsOptions options;
  bool cuda = false;

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
  std::vector<std::unique_ptr<ProcessGroup::Pending>> pending;

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

  void pack(size_t g) {
    for (size_t p : groups[g].params) {
      const at::Tensor& param = params[p];
      at::Tensor slice = flat[g].narrow(0, offset[p], param.numel()).view(param.sizes());
      const at::Tensor& grad = param.grad();
      if (grad.defined() && grad.data_ptr() == slice.data_ptr())
        continue;  // already the bucket's view (zero_grad kept it): accumulated in place
      if (grad.defined())
        slice.copy_(grad);
      else
        slice.zero_();
    }
  }

  void unpack(size_t g) {
    if (!pg->supports_average()) flat[g].div_(static_cast<double>(pg->size()));  // NCCL averaged already
    for (size_t p : groups[g].params) {
      at::Tensor& param = params[p];
      at::Tensor slice = flat[g].narrow(0, offset[p], param.numel()).view(param.sizes());
      if (slice.scalar_type() == param.scalar_type()) {
        // The gradient becomes a view of the bucket (no copy back). The next pack() of this group runs after this
        // step's optimizer (stream order), and zero_grad() drops the view before the next backward.
        param.mutable_grad() = slice;
      } else if (param.grad().defined()) {
        param.mutable_grad().copy_(slice);
      } else {
        param.mutable_grad() = slice.to(param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
    }
  }

  std::unique_ptr<ProcessGroup::Pending> reduce(size_t g) {
    return pg->supports_average() ? pg->allreduce_average(flat[g], what(g)) : pg->allreduce_sum(flat[g], what(g));
  }

  // Caller holds `mutex`.
  void launch(size_t g, bool in_backward) {
    profiler::Scope scope(scope_names[g], in_backward ? profiler::Phase::kBackward : profiler::Phase::kOther);
#ifdef VLATUNE_HAVE_NCCL
    if (cuda) {
      // The hook runs on the autograd device thread, whose current stream is the one backward computes on.
      const c10::DeviceIndex index = params[groups[g].params.front()].device().index();
      at::cuda::CUDAEvent grads_ready;
      grads_ready.record(c10::cuda::getCurrentCUDAStream(index));
      grads_ready.block(*comm_stream);
      c10::cuda::CUDAStreamGuard on_comm(*comm_stream);
      pack(g);
      pending[g] = reduce(g);
      if (in_backward) ++launched_in_backward;
      return;
    }
#endif
    pack(g);
    pending[g] = reduce(g);
    if (in_backward) ++launched_in_backward;
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

  std::vector<BucketAssignment> layout = groups;
  if (!options.overlap) {  // one bucket: every parameter, in list order
    BucketAssignment all{"<all>", {}};
    for (size_t p = 0; p < s.params.size(); ++p) all.params.push_back(p);
    layout = {all};
  }
  std::vector<char> assigned(s.params.size(), 0);
  const at::ScalarType dtype = options.reduce_fp32 ? at::kFloat : at::kBFloat16;
  for (const BucketAssignment& b : layout) {
    Group group;
    group.name = b.name;
    for (size_t p : b.params) {
      if (p >= s.params.size() || assigned[p])
        throw std::invalid_argument("gradient buckets: parameter index " + std::to_string(p) +
                                    " assigned twice or out of range");
      assigned[p] = 1;
      if (!s.params[p].requires_grad()) continue;
      s.offset[p] = group.numel;
      s.group_of[p] = s.groups.size();
      group.numel += s.params[p].numel();
      group.params.push_back(p);
    }
    if (group.params.empty()) continue;
    group.bytes = group.numel * static_cast<int64_t>(c10::elementSize(dtype));
    s.flat.push_back(at::zeros({group.numel}, s.params[group.params.front()].options().dtype(dtype)));
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
  state_->armed = state_->options.overlap;
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
      s.next_launch = 0;
      s.late.reset();
      s.last_launched_in_backward = s.launched_in_backward;
      s.launched_in_backward = 0;
    }
  } reset{s};
  for (; s.next_launch < s.groups.size(); ++s.next_launch) s.launch(s.next_launch, /*in_backward=*/false);

  profiler::Scope scope(kCommScopeName, profiler::Phase::kOther);
#ifdef VLATUNE_HAVE_NCCL
  if (s.cuda) {
    const c10::DeviceIndex index = s.params.front().device().index();
    {
      c10::cuda::CUDAStreamGuard on_comm(*s.comm_stream);
      for (size_t g = 0; g < s.groups.size(); ++g) {
        s.pending[g]->wait();  // the comm stream waits for NCCL's
        s.unpack(g);
      }
    }
    at::cuda::CUDAEvent reduced;
    reduced.record(*s.comm_stream);
    reduced.block(c10::cuda::getCurrentCUDAStream(index));
    s.after_step();
    return;
  }
#endif
  for (size_t g = 0; g < s.groups.size(); ++g) {
    s.pending[g]->wait();
    s.unpack(g);
  }
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

}  // namespace vlatune::trainer
