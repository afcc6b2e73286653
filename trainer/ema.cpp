#include "trainer/ema.h"

#include <stdexcept>
#include <unordered_map>

namespace vlatune::trainer {

Ema::Ema(std::vector<std::pair<std::string, torch::Tensor>> named_params, double decay) : decay_(decay) {
  if (!(decay >= 0.0 && decay <= 1.0)) {
    throw std::invalid_argument("ema: decay must be in [0, 1], got " + std::to_string(decay));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : named_params) {
    names_.push_back(name);
    shadow_.push_back(p.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true).contiguous());
    params_.push_back(std::move(p));
  }
}

void Ema::update() {
  if (shadow_.empty()) return;
  torch::NoGradGuard no_grad;
  // Two foreach passes; mixed dtypes (fp32 shadow, bf16 params) promote to fp32 inside add_ without a temporary.
  torch::_foreach_mul_(shadow_, decay_);
  torch::_foreach_add_(shadow_, params_, 1.0 - decay_);
}

void Ema::apply_to(const std::vector<std::pair<std::string, torch::Tensor>>& named) const {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < names_.size(); ++i) index.emplace(names_[i], i);
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : named) {
    auto it = index.find(name);
    if (it == index.end()) throw std::invalid_argument("ema: apply_to: no shadow for '" + name + "'");
    const torch::Tensor& s = shadow_[it->second];
    if (t.sizes() != s.sizes()) {
      throw std::invalid_argument("ema: apply_to: '" + name + "' has shape " + c10::str(t.sizes()) + ", the shadow " +
                                  c10::str(s.sizes()));
    }
    torch::Tensor target = t;  // shares storage
    target.copy_(s);
  }
}

void Ema::apply_to_params() const {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor target = params_[i];
    target.copy_(shadow_[i]);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> Ema::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(names_.size());
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i], shadow_[i]);
  return out;
}

void Ema::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  if (state.size() != names_.size()) {
    throw std::invalid_argument("ema: load_state: " + std::to_string(state.size()) + " tensors, expected " +
                                std::to_string(names_.size()));
  }
  std::unordered_map<std::string, const torch::Tensor*> by_name;
  for (const auto& [name, t] : state) by_name.emplace(name, &t);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < names_.size(); ++i) {
    auto it = by_name.find(names_[i]);
    if (it == by_name.end()) throw std::invalid_argument("ema: load_state: missing '" + names_[i] + "'");
    if (it->second->sizes() != shadow_[i].sizes()) {
      throw std::invalid_argument("ema: load_state: '" + names_[i] + "' has shape " + c10::str(it->second->sizes()) +
                                  ", expected " + c10::str(shadow_[i].sizes()));
    }
    shadow_[i].copy_(*it->second);
  }
}

}  // namespace vlatune::trainer
