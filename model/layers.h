// The model's own small modules. Every forward opens a profiler scope named by the module's openpi FQN
// (ScopedModule::fqn(), assigned once after construction by assign_fqns()), so profiles attribute GPU work to
// modules. Precision rule shared by all of them: activations run in the input's dtype (the "compute dtype");
// a Linear/conv casts its weight to that dtype when they differ (fp32-master: fp32 params, bf16 compute);
// statistics (RMS, softmax, RoPE) run in math_dtype(): fp32, or fp64 when the activations are fp64.
#pragma once

#include <string>

#include <torch/torch.h>

#include "kernels/fused_ops.h"
#include "model/config.h"

namespace vlatune::model {

struct Float8State;  // model/float8_linear.h

// fp64 stays fp64 (exactness tests); every other dtype does its statistics in fp32.
c10::ScalarType math_dtype(c10::ScalarType compute);

// A torch module that knows its fully qualified name (openpi state-dict prefix).
class ScopedModule : public torch::nn::Module {
 public:
  const std::string& fqn() const { return fqn_; }
  void set_fqn(std::string fqn) { fqn_ = std::move(fqn); }

 private:
  std::string fqn_;
};

// Gives every ScopedModule below `root` its dotted name relative to root (root itself keeps its own).
void assign_fqns(torch::nn::Module& root);

// y = x W^T (+ b). Weight [out, in] as nn.Linear; cast to the input's dtype when they differ. With `fp8` set
// (Pi05Impl::set_fp8) the GEMMs run in FP8 (model/float8_linear.h); else kernels::linear (at::linear; on CUDA
// bf16/fp16 with a bias, its own node whose bias gradient is kernels::bias_grad).
// With a LoRA adapter (add_lora; model/lora.h): y += (alpha / rank) (x A^T) B^T, two small GEMMs in x's dtype.
class LinearImpl : public ScopedModule {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, torch::TensorOptions options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;        // bias undefined when built without one
  std::shared_ptr<Float8State> fp8;  // null: bf16 (the compute dtype)

  // Registers the adapter parameters `lora_A` [rank, in] (drawn from N(0, 0.01^2) with `gen`, openpi's LoRA init)
  // and `lora_B` [out, rank] (zeros, so the output is the base's until B trains), in the weight's dtype and device,
  // and freezes the weight and bias. Throws std::invalid_argument naming the module when it already has one, or the
  // rank is not in 1..min(in, out).
  void add_lora(int64_t rank, double alpha, at::Generator gen);
  bool has_lora() const { return lora_A.defined(); }
  double lora_scale() const { return lora_alpha / static_cast<double>(lora_rank); }
  // (alpha / rank) (x A^T) B^T in x's dtype, in this module's scope; undefined without an adapter.
  torch::Tensor lora_delta(const torch::Tensor& x) const;
  torch::Tensor lora_A, lora_B;  // undefined: no adapter
  int64_t lora_rank = 0;
  double lora_alpha = 0;
};
TORCH_MODULE(Linear);

// The adapters' part of a merged GEMM over `members` that read `x`: [..., sum N_i] in member column order, zeros
// for the members without an adapter; undefined when none has one. `rebuild` (optional, filled by the base GEMM):
// extended so that the rebuilt output includes this part (its tensors appended to rebuild->saved).
torch::Tensor merged_lora_delta(const torch::Tensor& x, std::initializer_list<const LinearImpl*> members,
                                kernels::MergedRebuild* rebuild = nullptr);

// The FP8 state of a merged GEMM over these Linears: the first member's that has one, else null (bf16).
Float8State* merged_fp8_state(std::initializer_list<const LinearImpl*> members);

// Packs the members of a merged GEMM (weights of one layer's q/k/v, gate/up; or their biases) into one buffer
// [sum N_i, ...] on their device in their dtype: the values are copied in and each member becomes a row slice of
// the buffer (set_data, as FSDP's flat parameters; names, requires_grad, autograd hooks and state dicts are
// unchanged), so kernels::merged_linear reads the stack as one view instead of concatenating. In-place writes
// (optimizer, state-dict loads, EMA) keep the packing; anything that replaces a member's storage (Module::to(), a
// new set_data) silently undoes it for that group (still correct: merged_linear falls back to at::cat) until
// packed again. Returns false when there is nothing to do (fewer than two members, already packed, meta
// device). Throws std::invalid_argument for members of different dtypes, devices or trailing sizes.
bool pack_rows(const std::vector<torch::Tensor>& members);

// The norms below fuse the residual add before them: h = x + delta (delta may be undefined: h = x), y = norm(h),
// through one entry point of kernels/fused_ops.h on `path` (the kernels and their autograd node, or the ATen
// reference differentiated by autograd).

// LayerNorm over the last dim (SigLIP, eps 1e-6). Statistics accumulate in fp32 inside ATen for bf16 inputs.
class LayerNormImpl : public ScopedModule {
 public:
  LayerNormImpl(int64_t dim, double eps, torch::TensorOptions options);
  kernels::NormOutputs forward(const torch::Tensor& x, const torch::Tensor& delta = {},
                               kernels::OpPath path = kernels::OpPath::kReference);
  torch::Tensor weight, bias;
  double eps;
};
TORCH_MODULE(LayerNorm);

// Gemma RMSNorm: h * rsqrt(mean(h^2) + eps) * (1 + w), computed in math_dtype, cast back (spec §3 step 1).
class RMSNormImpl : public ScopedModule {
 public:
  RMSNormImpl(int64_t dim, double eps, torch::TensorOptions options);
  kernels::NormOutputs forward(const torch::Tensor& x, const torch::Tensor& delta = {},
                               kernels::OpPath path = kernels::OpPath::kReference);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Adaptive RMSNorm of the action expert (spec §4.3): [scale, shift, gate] = dense(cond) (dense: cond_dim ->
// 3*dim, with bias), y = rms(h) * (1 + scale) + shift in math_dtype, cast back; gate (compute dtype) drives
// the gated residual. No learned scale vector. The residual before it is gated by the previous norm's gate:
// h = x + gate_prev * delta (delta undefined: h = x).
class AdaRMSNormImpl : public ScopedModule {
 public:
  AdaRMSNormImpl(int64_t dim, int64_t cond_dim, double eps, torch::TensorOptions options);
  struct Output {
    torch::Tensor h;     // the residual stream the norm read
    torch::Tensor y;     // [B, T, dim]
    torch::Tensor gate;  // [B, 1, dim]
  };
  // cond [B, cond_dim], already in the compute dtype.
  Output forward(const torch::Tensor& x, const torch::Tensor& cond, const torch::Tensor& delta = {},
                 const torch::Tensor& gate_prev = {}, kernels::OpPath path = kernels::OpPath::kReference);
  // dense(cond) [B, 3*dim]: the modulation, computed once by a caller that reuses it (sampling, where cond
  // depends on the Euler step only).
  torch::Tensor modulation(const torch::Tensor& cond, const torch::Tensor& like);
  // forward with the modulation given.
  Output forward_modulated(const torch::Tensor& x, const torch::Tensor& modulation, const torch::Tensor& delta = {},
                           const torch::Tensor& gate_prev = {}, kernels::OpPath path = kernels::OpPath::kReference);
  Linear dense{nullptr};
  double eps;
};
TORCH_MODULE(AdaRMSNorm);

class EmbeddingImpl : public ScopedModule {
 public:
  EmbeddingImpl(int64_t num, int64_t dim, torch::TensorOptions options);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;  // [num, dim]
};
TORCH_MODULE(Embedding);

// Non-overlapping patchify conv (kernel = stride = patch, no padding), with bias: weight [out, in, p, p].
class PatchConvImpl : public ScopedModule {
 public:
  PatchConvImpl(int64_t in, int64_t out, int64_t patch, torch::TensorOptions options);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;
  int64_t patch;
};
TORCH_MODULE(PatchConv);

// gelu with the tanh approximation (flax nn.gelu default, HF gelu_pytorch_tanh).
torch::Tensor gelu_tanh(const torch::Tensor& x);

// Scaled dot-product attention, scale head_dim^-0.5. q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D] with Hq a multiple
// of Hkv (every group of Hq/Hkv query heads shares one K/V head); mask: bool, broadcastable to [B, 1, Tq, Tk],
// true = may attend, undefined = no mask. Every query row must allow at least one key.
torch::Tensor attention_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, Attention mode);

}  // namespace vlatune::model
