#include "model/layers.h"

#include <cmath>
#include <stdexcept>

#include "model/float8_linear.h"
#include "profiler/scope.h"

namespace vlatune::model {

namespace {
// openpi's mask value (spec §3 step 7): replaces masked logits. exp() of it underflows to exactly 0 in
// fp32 and fp64, so masked keys contribute nothing.
constexpr double kMaskValue = -2.3819763e38;

torch::Tensor as_dtype_of(const torch::Tensor& t, const torch::Tensor& like) {
  return t.scalar_type() == like.scalar_type() ? t : t.to(like.scalar_type());
}
}  // namespace

c10::ScalarType math_dtype(c10::ScalarType compute) {
  return compute == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

void assign_fqns(torch::nn::Module& root) {
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto* scoped = dynamic_cast<ScopedModule*>(item.value().get())) scoped->set_fqn(item.key());
  }
}

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, torch::TensorOptions options) {
  weight = register_parameter("weight", torch::zeros({out, in}, options));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out}, options));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  profiler::Scope scope(fqn());
  if (profiler::scopes_enabled()) profiler::note_gemm({&fqn()}, x.numel() / x.size(-1), weight.size(1), weight.size(0));
  if (fp8) return float8_linear(x, {weight}, bias, *fp8);
  return kernels::linear(x, as_dtype_of(weight, x), bias.defined() ? as_dtype_of(bias, x) : torch::Tensor());
}

Float8State* merged_fp8_state(std::initializer_list<const LinearImpl*> members) {
  for (const LinearImpl* l : members)
    if (l->fp8) return l->fp8.get();
  return nullptr;
}

bool pack_rows(const std::vector<torch::Tensor>& members) {
  if (members.size() < 2) return false;
  const torch::Tensor& first = members[0];
  int64_t rows = 0;
  for (const torch::Tensor& m : members) {
    if (!m.defined() || m.dim() < 1 || m.scalar_type() != first.scalar_type() || m.device() != first.device() ||
        m.sizes().slice(1) != first.sizes().slice(1))
      throw std::invalid_argument(
          "pack_rows: members must be defined tensors of one dtype and device with equal "
          "sizes beyond dim 0");
    rows += m.size(0);
  }
  if (first.device().is_meta() || kernels::packed_rows(members).defined()) return false;
  std::vector<int64_t> sizes = first.sizes().vec();
  sizes[0] = rows;
  torch::NoGradGuard no_grad;
  const torch::Tensor packed = torch::empty(sizes, first.options().requires_grad(false));
  int64_t offset = 0;
  for (const torch::Tensor& m : members) {
    const int64_t n = m.size(0);
    torch::Tensor slice = packed.narrow(0, offset, n);
    slice.copy_(m.detach());
    m.set_data(slice);
    offset += n;
  }
  return true;
}

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_, torch::TensorOptions options) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}, options));
  bias = register_parameter("bias", torch::zeros({dim}, options));
}

kernels::NormOutputs LayerNormImpl::forward(const torch::Tensor& x, const torch::Tensor& delta, kernels::OpPath path) {
  profiler::Scope scope(fqn());
  return kernels::layer_norm_residual(x, delta, weight, bias, eps, path);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_, torch::TensorOptions options) : eps(eps_) {
  weight = register_parameter("weight", torch::zeros({dim}, options));
}

kernels::NormOutputs RMSNormImpl::forward(const torch::Tensor& x, const torch::Tensor& delta, kernels::OpPath path) {
  profiler::Scope scope(fqn());
  return kernels::rms_norm_residual(x, delta, weight, eps, path);
}

AdaRMSNormImpl::AdaRMSNormImpl(int64_t dim, int64_t cond_dim, double eps_, torch::TensorOptions options) : eps(eps_) {
  dense = register_module("dense", Linear(cond_dim, 3 * dim, /*bias=*/true, options));
}

AdaRMSNormImpl::Output AdaRMSNormImpl::forward(const torch::Tensor& x, const torch::Tensor& cond,
                                               const torch::Tensor& delta, const torch::Tensor& gate_prev,
                                               kernels::OpPath path) {
  return forward_modulated(x, modulation(cond, x), delta, gate_prev, path);
}

torch::Tensor AdaRMSNormImpl::modulation(const torch::Tensor& cond, const torch::Tensor& like) {
  profiler::Scope scope(fqn());
  return dense->forward(as_dtype_of(cond, like));
}

AdaRMSNormImpl::Output AdaRMSNormImpl::forward_modulated(const torch::Tensor& x, const torch::Tensor& modulation,
                                                         const torch::Tensor& delta, const torch::Tensor& gate_prev,
                                                         kernels::OpPath path) {
  profiler::Scope scope(fqn());
  // [B, 3*dim] -> three [B, 1, dim] views: elements 0..dim-1 scale, dim..2dim-1 shift, 2dim..3dim-1 gate.
  auto parts = modulation.unsqueeze(1).chunk(3, -1);
  auto out = kernels::adarms_norm_residual(x, delta, gate_prev, parts[0], parts[1], eps, path);
  return {out.h, out.y, parts[2]};
}

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim, torch::TensorOptions options) {
  weight = register_parameter("weight", torch::zeros({num, dim}, options));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  profiler::Scope scope(fqn());
  return at::embedding(weight, ids);
}

PatchConvImpl::PatchConvImpl(int64_t in, int64_t out, int64_t patch_, torch::TensorOptions options) : patch(patch_) {
  weight = register_parameter("weight", torch::zeros({out, in, patch, patch}, options));
  bias = register_parameter("bias", torch::zeros({out}, options));
}

torch::Tensor PatchConvImpl::forward(const torch::Tensor& x) {
  profiler::Scope scope(fqn());
  return at::conv2d(x, as_dtype_of(weight, x), as_dtype_of(bias, x), /*stride=*/{patch, patch});
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return at::gelu(x, "tanh");
}

torch::Tensor attention_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, Attention mode) {
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  if (mode == Attention::kLean) {
    // enable_gqa: the kernel indexes the shared K/V head instead of copying it to every query head.
    std::optional<torch::Tensor> attn_mask;
    if (mask.defined()) attn_mask = mask;
    return at::scaled_dot_product_attention(q, k, v, attn_mask, /*dropout_p=*/0.0, /*is_causal=*/false, scale,
                                            /*enable_gqa=*/heads != kv_heads);
  }
  // Materialized reference: repeat K/V, logits, fp32 masked softmax, probabilities back in the activation dtype.
  auto kr = heads == kv_heads ? k : k.repeat_interleave(heads / kv_heads, /*dim=*/1);
  auto vr = heads == kv_heads ? v : v.repeat_interleave(heads / kv_heads, /*dim=*/1);
  auto logits = at::matmul(q, kr.transpose(-1, -2)).to(math_dtype(q.scalar_type())) * scale;
  if (mask.defined()) logits = logits.masked_fill(mask.logical_not(), kMaskValue);
  auto probs = at::softmax(logits, -1).to(q.scalar_type());
  return at::matmul(probs, vr);
}

}  // namespace vlatune::model
