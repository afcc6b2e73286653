#include "model/layers.h"

#include <algorithm>
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
  torch::Tensor y =
      fp8 ? float8_linear(x, {weight}, bias, *fp8)
          : kernels::linear(x, as_dtype_of(weight, x), bias.defined() ? as_dtype_of(bias, x) : torch::Tensor());
  if (has_lora()) y = y + lora_delta(x);
  return y;
}

void LinearImpl::add_lora(int64_t rank, double alpha, at::Generator gen) {
  const int64_t out = weight.size(0), in = weight.size(1);
  if (has_lora()) throw std::invalid_argument("add_lora: " + fqn() + " already has a LoRA adapter");
  if (rank < 1 || rank > std::min(in, out))
    throw std::invalid_argument("add_lora: rank " + std::to_string(rank) + " for " + fqn() + " [" +
                                std::to_string(out) + ", " + std::to_string(in) + "]: expected 1.." +
                                std::to_string(std::min(in, out)) + " (the Linear's smaller dimension)");
  if (!(alpha > 0) || !std::isfinite(alpha))
    throw std::invalid_argument("add_lora: alpha for " + fqn() + " must be a finite number > 0");
  torch::NoGradGuard no_grad;
  const auto options = weight.options().requires_grad(false);
  torch::Tensor a = torch::empty({rank, in}, options);
  if (!weight.device().is_meta()) a.normal_(0.0, 0.01, gen);
  lora_A = register_parameter("lora_A", a);
  lora_B = register_parameter("lora_B", torch::zeros({out, rank}, options));
  lora_rank = rank;
  lora_alpha = alpha;
  weight.requires_grad_(false);
  if (bias.defined()) bias.requires_grad_(false);
}

torch::Tensor LinearImpl::lora_delta(const torch::Tensor& x) const {
  if (!has_lora()) return torch::Tensor();
  profiler::Scope scope(fqn());
  // The scale goes on the [.., rank] intermediate: the smallest tensor of the three.
  return at::linear(at::linear(x, as_dtype_of(lora_A, x)) * lora_scale(), as_dtype_of(lora_B, x));
}

namespace {
// One member of a merged GEMM for the adapters' part: its adapter (a undefined: none), scale and output width.
struct LoraPart {
  torch::Tensor a, b;
  double scale = 0;
  int64_t out = 0;
};

torch::Tensor lora_parts_delta(const torch::Tensor& x, const std::vector<LoraPart>& parts) {
  std::vector<torch::Tensor> columns;
  for (const LoraPart& p : parts) {
    if (p.a.defined()) {
      columns.push_back(at::linear(at::linear(x, as_dtype_of(p.a, x)) * p.scale, as_dtype_of(p.b, x)));
    } else {
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = p.out;
      columns.push_back(torch::zeros(shape, x.options().requires_grad(false)));
    }
  }
  return columns.size() == 1 ? columns[0] : at::cat(columns, -1);
}
}  // namespace

torch::Tensor merged_lora_delta(const torch::Tensor& x, std::initializer_list<const LinearImpl*> members,
                                kernels::MergedRebuild* rebuild) {
  std::vector<LoraPart> parts;
  bool any = false;
  for (const LinearImpl* l : members) {
    parts.push_back({l->lora_A, l->lora_B, l->has_lora() ? l->lora_scale() : 0.0, l->weight.size(0)});
    any = any || l->has_lora();
  }
  if (!any) return torch::Tensor();
  torch::Tensor delta = lora_parts_delta(x, parts);
  if (rebuild != nullptr && rebuild->fn) {
    // The rebuilt GEMM output must be base + adapters, bit-identical to the forward's: the same ops on the same
    // tensors. saved: [base..., x, then A and B of each member with an adapter].
    std::vector<std::pair<double, int64_t>> layout;  // scale (0: no adapter), out per member
    const size_t base_count = rebuild->saved.size();
    rebuild->saved.push_back(x.detach());
    for (const LoraPart& p : parts) {
      layout.emplace_back(p.a.defined() ? p.scale : 0.0, p.out);
      if (p.a.defined()) {
        rebuild->saved.push_back(p.a.detach());
        rebuild->saved.push_back(p.b.detach());
      }
    }
    rebuild->fn = [base = std::move(rebuild->fn), base_count, layout](const std::vector<torch::Tensor>& saved) {
      torch::NoGradGuard no_grad;
      const std::vector<torch::Tensor> base_saved(saved.begin(), saved.begin() + static_cast<int64_t>(base_count));
      std::vector<LoraPart> rebuilt;
      size_t next = base_count + 1;
      for (const auto& [scale, out] : layout) {
        LoraPart p{torch::Tensor(), torch::Tensor(), scale, out};
        if (scale != 0.0) {
          p.a = saved[next++];
          p.b = saved[next++];
        }
        rebuilt.push_back(std::move(p));
      }
      return base(base_saved) + lora_parts_delta(saved[base_count], rebuilt);
    };
  }
  return delta;
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
