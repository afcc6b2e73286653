#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "kernels/adamw_ops.h"

namespace vlatune::trainer {

OptimizerPrecision parse_optimizer_precision(const std::string& name) {
  if (name == "bf16") return OptimizerPrecision::kBf16;
  if (name == "fp32-master") return OptimizerPrecision::kFp32Master;
  throw std::invalid_argument("optimizer precision must be \"bf16\" or \"fp32-master\", got \"" + name + "\"");
}

const char* optimizer_precision_name(OptimizerPrecision precision) {
  return precision == OptimizerPrecision::kFp32Master ? "fp32-master" : "bf16";
}

OptimizerStateDtype parse_optimizer_state_dtype(const std::string& name) {
  if (name == "auto") return OptimizerStateDtype::kAuto;
  if (name == "int8-blockwise") return OptimizerStateDtype::kInt8Blockwise;
  throw std::invalid_argument("optimizer state dtype must be \"auto\" or \"int8-blockwise\", got \"" + name + "\"");
}

const char* optimizer_state_dtype_name(OptimizerStateDtype state_dtype) {
  return state_dtype == OptimizerStateDtype::kInt8Blockwise ? "int8-blockwise" : "auto";
}

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> named_params, AdamWOptions options)
    : AdamW(std::move(named_params), std::move(options), {}, {}) {}

AdamW::AdamW(std::vector<std::pair<std::string, torch::Tensor>> named_params, AdamWOptions options,
             std::vector<ParamRange> ranges, ShardedGradients gradients)
    : options_(std::move(options)), ranges_(std::move(ranges)), sharded_(std::move(gradients)) {
  if (!ranges_.empty() && ranges_.size() != named_params.size())
    throw std::invalid_argument("adamw: " + std::to_string(ranges_.size()) + " ranges for " +
                                std::to_string(named_params.size()) + " parameters");
  if (!ranges_.empty() && (!sharded_.range_gradient || (!sharded_.whole_gradients && !sharded_.sum_over_ranks)))
    throw std::invalid_argument("adamw: a sharded optimizer needs its range gradients and a sum over ranks");
  const auto [beta1, beta2] = options_.betas;
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    throw std::invalid_argument("adamw: betas must be in [0, 1), got (" + std::to_string(beta1) + ", " +
                                std::to_string(beta2) + ")");
  }
  if (!(options_.eps >= 0) || !(options_.weight_decay >= 0)) {
    throw std::invalid_argument("adamw: eps and weight_decay must be >= 0");
  }
  torch::NoGradGuard no_grad;
  std::set<std::string> seen;
  for (auto& [name, p] : named_params) {
    if (!p.defined()) throw std::invalid_argument("adamw: parameter '" + name + "' is undefined");
    if (!seen.insert(name).second) throw std::invalid_argument("adamw: parameter '" + name + "' appears twice");
    if (p.scalar_type() != torch::kFloat32 && p.scalar_type() != torch::kBFloat16) {
      throw std::invalid_argument("adamw: parameter '" + name + "' must be f32 or bf16, got " +
                                  std::string(c10::toString(p.scalar_type())));
    }
    if (!p.is_contiguous()) throw std::invalid_argument("adamw: parameter '" + name + "' is not contiguous");
    if (!params_.empty() && p.device() != params_.front().device()) {
      throw std::invalid_argument("adamw: parameter '" + name + "' is on " + p.device().str() + ", '" + names_.front() +
                                  "' on " + params_.front().device().str());
    }
    // fp32-master needs a master only for bf16 parameters: an fp32 parameter is its own master.
    const bool has_master =
        options_.precision == OptimizerPrecision::kFp32Master && p.scalar_type() == torch::kBFloat16;
    const auto state_dtype = has_master ? torch::kFloat32 : p.scalar_type();
    const bool int8 =
        options_.state_dtype == OptimizerStateDtype::kInt8Blockwise && p.numel() >= options_.int8_min_numel;
    // The tensor updates write: the parameter, or this rank's range of it (a 1-D view of its storage).
    torch::Tensor target = p;
    if (sharded()) {
      const ParamRange r = ranges_[names_.size()];
      if (r.start < 0 || r.length < 0 || r.start + r.length > p.numel() ||
          (int8 && r.length > 0 && r.start % kernels::kAdamwQuantBlock != 0))
        throw std::invalid_argument("adamw: the range [" + std::to_string(r.start) + ", " +
                                    std::to_string(r.start + r.length) + ") of parameter '" + name + "' (" +
                                    std::to_string(p.numel()) + " elements) is outside it" +
                                    (int8 ? " or not on a 256-value block of its 8-bit state" : ""));
      target = p.detach().view({-1}).narrow(0, r.start, r.length);
    }
    names_.push_back(name);
    master_.push_back(has_master ? target.detach().to(torch::kFloat32, false, true) : torch::Tensor());
    if (int8) {
      // Codes of 0.0 and zero block scales: a fresh state, as the zeros of the full-precision one.
      const kernels::AdamwQuantMaps& maps = kernels::adamw_quant_maps();
      const auto blocks = kernels::adamw_quant_blocks(target.numel());
      exp_avg_.push_back(torch::full_like(target, maps.exp_avg_zero, target.options().dtype(torch::kUInt8)));
      exp_avg_sq_.push_back(torch::full_like(target, maps.exp_avg_sq_zero, target.options().dtype(torch::kUInt8)));
      exp_avg_absmax_.push_back(torch::zeros({blocks}, target.options().dtype(torch::kFloat32)));
      exp_avg_sq_absmax_.push_back(torch::zeros({blocks}, target.options().dtype(torch::kFloat32)));
    } else {
      exp_avg_.push_back(torch::zeros_like(target, target.options().dtype(state_dtype)));
      exp_avg_sq_.push_back(torch::zeros_like(target, target.options().dtype(state_dtype)));
      exp_avg_absmax_.emplace_back();
      exp_avg_sq_absmax_.emplace_back();
    }
    decay_.push_back(!(options_.no_decay && options_.no_decay(name)));
    params_.push_back(target);
    whole_params_.push_back(p);
  }
  build_groups();
}

void AdamW::build_groups() {
  // Groups: (decays, dtype, has master, 8-bit state) -> one adamw_step call each, in first-appearance order.
  std::map<std::tuple<bool, int, bool, bool>, size_t> group_of;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].numel() == 0) continue;  // no range of it on this rank
    const bool int8 = exp_avg_absmax_[i].defined();
    const auto key =
        std::make_tuple(bool(decay_[i]), static_cast<int>(params_[i].scalar_type()), master_[i].defined(), int8);
    auto it = group_of.find(key);
    if (it == group_of.end()) {
      it = group_of.emplace(key, groups_.size()).first;
      groups_.emplace_back();
      groups_.back().weight_decay = decay_[i] ? options_.weight_decay : 0.0;
      groups_.back().int8 = int8;
    }
    Group& g = groups_[it->second];
    g.index.push_back(i);
    g.params.push_back(params_[i]);
    g.exp_avg.push_back(exp_avg_[i]);
    g.exp_avg_sq.push_back(exp_avg_sq_[i]);
    if (master_[i].defined()) g.master.push_back(master_[i]);
    if (int8) {
      g.exp_avg_absmax.push_back(exp_avg_absmax_[i]);
      g.exp_avg_sq_absmax.push_back(exp_avg_sq_absmax_[i]);
    }
  }
}

StepResult AdamW::step(double lr, double max_grad_norm) {
  return finish_update(lr, max_grad_norm, queue_update(lr, max_grad_norm, /*device_schedule=*/false));
}

kernels::AdamwParams AdamW::next_update(double lr) const {
  kernels::AdamwParams hp;
  hp.lr = lr;
  hp.beta1 = options_.betas.first;
  hp.beta2 = options_.betas.second;
  hp.eps = options_.eps;
  hp.step = step_ + 1;
  return hp;
}

torch::Tensor AdamW::queue_update(double lr, double max_grad_norm, bool device_schedule,
                                  const torch::Tensor& in_flight_norm) {
  if (params_.empty()) return torch::Tensor();
  torch::NoGradGuard no_grad;
  const torch::Device device = params_.front().device();
  int64_t in_flight_updates = 0;  // the previous update, where it counts and the host can tell at no cost
  if (in_flight_norm.defined()) {
    if (device.is_cuda()) {
      write_device_schedule(lr, in_flight_norm);
      device_schedule = true;
    } else {
      in_flight_updates = std::isfinite(in_flight_norm.item<double>()) ? 1 : 0;
    }
  }
  if (device_schedule && !device.is_cuda())
    throw std::invalid_argument("adamw: a device schedule needs CUDA parameters, these are on " + device.str());
  if (device_schedule && !schedule_device_.defined())
    throw std::logic_error("adamw: queue_update with a device schedule before write_device_schedule");

  // The gradients in the parameters' dtype: of the whole parameters (unsharded), or of this rank's ranges.
  auto as_param_dtype = [](const torch::Tensor& g, const torch::Tensor& param) {
    return g.scalar_type() == param.scalar_type() ? g.contiguous() : g.to(param.scalar_type());
  };
  auto whole_grads = [&] {
    std::vector<torch::Tensor> grads(whole_params_.size());
    for (size_t i = 0; i < whole_params_.size(); ++i) {
      const torch::Tensor& g = whole_params_[i].grad();
      if (g.defined()) grads[i] = as_param_dtype(g, whole_params_[i]);  // undefined: a zero gradient
    }
    return grads;
  };
  std::vector<torch::Tensor> grads(params_.size());
  if (!sharded()) {
    grads = whole_grads();
  } else {
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].numel() > 0) grads[i] = as_param_dtype(sharded_.range_gradient(i), params_[i]);
  }

  // Clip coefficient on the device; NaN when the norm is not finite, which the update reads as "skip".
  torch::Tensor norm;
  if (!sharded() || sharded_.whole_gradients) {
    norm = kernels::global_grad_norm(sharded() ? whole_grads() : grads).to(device);
  } else {
    // Every rank gets the same sum, so every rank clips (or skips) alike.
    torch::Tensor sum_of_squares = kernels::global_grad_norm(grads).to(device).to(torch::kFloat64).square();
    sharded_.sum_over_ranks(sum_of_squares);
    norm = sum_of_squares.sqrt().to(torch::kFloat32);
  }
  torch::Tensor coef = max_grad_norm > 0 ? (max_grad_norm / (norm + 1e-6)).clamp_max(1.0) : torch::ones_like(norm);
  coef = torch::where(torch::isfinite(norm), coef, std::numeric_limits<double>::quiet_NaN());

  kernels::AdamwParams hp = next_update(lr);
  hp.step += in_flight_updates;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& group = groups_[gi];
    std::vector<torch::Tensor> group_grads;
    group_grads.reserve(group.index.size());
    for (size_t i : group.index) group_grads.push_back(grads[i]);
    hp.weight_decay = group.weight_decay;
    hp.step_scalars_device = device_schedule ? schedule_device_[static_cast<int64_t>(gi)].data_ptr<float>() : nullptr;
    std::vector<torch::Tensor>* master = group.master.empty() ? nullptr : &group.master;
    if (group.int8) {
      kernels::AdamwInt8State state{group.exp_avg, group.exp_avg_sq, group.exp_avg_absmax, group.exp_avg_sq_absmax};
      kernels::adamw_step_int8(group.params, group_grads, state, master, hp, coef);
    } else {
      kernels::adamw_step(group.params, group_grads, group.exp_avg, group.exp_avg_sq, master, hp, coef);
    }
  }
  return norm;
}

void AdamW::write_device_schedule(double lr, const torch::Tensor& in_flight_norm) {
  if (params_.empty()) return;
  const torch::Device device = params_.front().device();
  if (!device.is_cuda())
    throw std::invalid_argument("adamw: a device schedule needs CUDA parameters, these are on " + device.str());
  const int64_t groups = static_cast<int64_t>(groups_.size());
  if (!schedule_device_.defined()) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    schedule_device_ = torch::empty({groups, 3}, f32.device(device));
    schedule_choices_ = torch::empty({2, groups, 3}, f32.device(device));
    for (torch::Tensor& host : schedule_host_) host = torch::empty({2, groups, 3}, f32.pinned_memory(true));
  }
  torch::Tensor& host = schedule_host_[static_cast<size_t>(schedule_host_next_)];
  schedule_host_next_ ^= 1;
  float* out = host.data_ptr<float>();
  for (int64_t choice = 0; choice < 2; ++choice) {
    kernels::AdamwParams hp = next_update(lr);
    hp.step += choice;  // choice 1: the update in flight counts
    for (int64_t gi = 0; gi < groups; ++gi, out += 3) {
      hp.weight_decay = groups_[static_cast<size_t>(gi)].weight_decay;
      const kernels::AdamwStepScalars s = kernels::adamw_step_scalars(hp);
      out[0] = s.decay;
      out[1] = s.step_size;
      out[2] = s.bc2_sqrt;
    }
  }
  schedule_choices_.copy_(host, /*non_blocking=*/true);
  if (in_flight_norm.defined())
    schedule_device_.copy_(torch::where(torch::isfinite(in_flight_norm), schedule_choices_[1], schedule_choices_[0]));
  else
    schedule_device_.copy_(schedule_choices_[0]);
}

StepResult AdamW::finish_update(double lr, double max_grad_norm, const torch::Tensor& norm) {
  // The one host sync of the step: for the log and the guard (the update is already queued). No parameters: no
  // norm (queue_update returned an undefined tensor).
  return finish_update(lr, max_grad_norm, params_.empty() ? 0.0 : norm.item<double>());
}

StepResult AdamW::finish_update(double lr, double max_grad_norm, double grad_norm) {
  StepResult result;
  result.lr = lr;
  result.step = step_;
  if (params_.empty()) return result;
  result.grad_norm = grad_norm;
  result.skipped = !std::isfinite(result.grad_norm);
  if (result.skipped) {
    result.clip_coef = 0.0;
    ++skipped_;
  } else {
    result.clip_coef = max_grad_norm > 0 ? std::min(1.0, max_grad_norm / (result.grad_norm + 1e-6)) : 1.0;
    ++step_;
  }
  result.step = step_;
  return result;
}

void AdamW::zero_grad() {
  for (torch::Tensor& p : whole_params_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
}

std::vector<AdamW::StateEntry> AdamW::state_entries() const {
  std::vector<StateEntry> out;
  for (size_t i = 0; i < names_.size(); ++i) {
    const torch::Tensor& whole = whole_params_[i];
    const ParamRange range = sharded() ? ranges_[i] : ParamRange{0, whole.numel()};
    auto add = [&](const std::string& kind, const torch::Tensor& local) {
      out.push_back({kind + "." + names_[i], local, whole.sizes().vec(), range.start, whole.numel()});
    };
    add("exp_avg", exp_avg_[i]);
    add("exp_avg_sq", exp_avg_sq_[i]);
    if (master_[i].defined()) add("master", master_[i]);
    if (exp_avg_absmax_[i].defined()) {
      // Block scales: one per 256 values, a range's blocks starting at its first value's.
      const int64_t blocks = kernels::adamw_quant_blocks(whole.numel());
      const int64_t start = range.start / kernels::kAdamwQuantBlock;
      out.push_back({"exp_avg_absmax." + names_[i], exp_avg_absmax_[i], {blocks}, start, blocks});
      out.push_back({"exp_avg_sq_absmax." + names_[i], exp_avg_sq_absmax_[i], {blocks}, start, blocks});
    }
  }
  return out;
}

OptimizerState AdamW::state_dict() const {
  if (sharded()) throw std::logic_error("adamw: the state of a sharded optimizer is gathered: state_dict(gather)");
  return state_dict(RangeGather());
}

OptimizerState AdamW::state_dict(const RangeGather& gather) const {
  OptimizerState state;
  state.precision = optimizer_precision_name(options_.precision);
  for (const StateEntry& e : state_entries()) {
    if (!sharded()) {
      state.tensors.emplace_back(e.name, e.local);
      continue;
    }
    torch::NoGradGuard no_grad;
    state.tensors.emplace_back(e.name, gather(e.local.view({-1}), e.start, e.numel).view(e.sizes));
  }
  state.scalars["step"] = static_cast<double>(step_);
  state.scalars["skipped_steps"] = static_cast<double>(skipped_);
  state.scalars["beta1"] = options_.betas.first;
  state.scalars["beta2"] = options_.betas.second;
  state.scalars["eps"] = options_.eps;
  state.scalars["weight_decay"] = options_.weight_decay;
  return state;
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& list : {&exp_avg_, &exp_avg_sq_, &master_, &exp_avg_absmax_, &exp_avg_sq_absmax_}) {
    for (const torch::Tensor& t : *list) bytes += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  }
  return bytes;
}

void AdamW::load_state_dict(const OptimizerState& state) {
  const std::string mine = optimizer_precision_name(options_.precision);
  if (state.precision != mine) {
    throw std::invalid_argument("adamw: load_state_dict: the checkpoint's optimizer precision is \"" + state.precision +
                                "\", this run's is \"" + mine + "\"");
  }
  std::unordered_map<std::string, const torch::Tensor*> by_name;
  for (const auto& [name, t] : state.tensors) by_name.emplace(name, &t);
  // The tensors say which state dtype wrote them: block scales only come with 8-bit moments.
  const bool theirs_int8 = std::any_of(state.tensors.begin(), state.tensors.end(),
                                       [](const auto& e) { return e.first.rfind("exp_avg_absmax.", 0) == 0; });
  const bool mine_int8 =
      std::any_of(exp_avg_absmax_.begin(), exp_avg_absmax_.end(), [](const torch::Tensor& t) { return t.defined(); });
  if (theirs_int8 != mine_int8) {
    throw std::invalid_argument(std::string("adamw: load_state_dict: the checkpoint's optimizer state dtype is \"") +
                                (theirs_int8 ? "int8-blockwise" : "auto") + "\", this run's is \"" +
                                (mine_int8 ? "int8-blockwise" : "auto") + "\"");
  }
  const std::vector<StateEntry> expected = state_entries();
  for (const StateEntry& e : expected) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) throw std::invalid_argument("adamw: load_state_dict: missing tensor '" + e.name + "'");
    const torch::Tensor& src = *it->second;
    if (src.sizes() != at::IntArrayRef(e.sizes) || src.scalar_type() != e.local.scalar_type()) {
      throw std::invalid_argument("adamw: load_state_dict: '" + e.name + "' is " +
                                  std::string(c10::toString(src.scalar_type())) + " " + c10::str(src.sizes()) +
                                  ", expected " + std::string(c10::toString(e.local.scalar_type())) + " " +
                                  c10::str(at::IntArrayRef(e.sizes)));
    }
  }
  if (by_name.size() != expected.size()) {
    std::set<std::string> known;
    for (const StateEntry& e : expected) known.insert(e.name);
    for (const auto& entry : state.tensors) {
      if (!known.count(entry.first)) {
        throw std::invalid_argument("adamw: load_state_dict: unexpected tensor '" + entry.first + "'");
      }
    }
  }
  for (const char* key : {"step", "skipped_steps"}) {
    if (!state.scalars.count(key)) {
      throw std::invalid_argument(std::string("adamw: load_state_dict: missing scalar '") + key + "'");
    }
  }
  torch::NoGradGuard no_grad;
  for (const StateEntry& e : expected) {
    torch::Tensor target = e.local;  // shares storage with the live state
    const torch::Tensor& src = *by_name.at(e.name);
    target.copy_(sharded() ? src.reshape({-1}).narrow(0, e.start, target.numel()).view(target.sizes()) : src);
  }
  step_ = static_cast<int64_t>(state.scalars.at("step"));
  skipped_ = static_cast<int64_t>(state.scalars.at("skipped_steps"));
}

}  // namespace vlatune::trainer
