// The references of the fused AdamW and of the global gradient norm (contract: adamw_ops.h).
// Full-precision state: plain tensor ops in fp32, in torch::optim::AdamW's order of operations, so that on fp32
// tensors it matches torch's own optimizer to rounding; bf16 storage is read into fp32 and rounded back (to
// nearest even) once per step, as the CUDA kernel does.
// 8-bit state: a plain loop with the kernel's own fp32 operations (adamw_int8_math.h): ATen's vectorized CPU ops
// may fuse multiply-adds, and one flipped code is a visible difference, so the reference and the kernel share the
// arithmetic instead of a tolerance.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/adamw_int8_math.h"
#include "kernels/adamw_ops.h"

namespace vlatune::kernels {

void adamw_step_ref(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    std::vector<at::Tensor>& exp_avg, std::vector<at::Tensor>& exp_avg_sq,
                    std::vector<at::Tensor>* master, const AdamwParams& p, const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;  // parameters are leaves that require grad: in-place updates must not be recorded
  at::Tensor scale;         // fp32 0-d: host factor times the device factor
  if (grad_scale.defined()) {
    // The reference may sync: it decides the skip on the host, where the kernel decides it per block.
    if (!std::isfinite(grad_scale.item<double>())) return;
    scale = grad_scale.to(at::kFloat) * p.grad_scale;
  } else if (p.grad_scale != 1.0) {
    scale = at::scalar_tensor(p.grad_scale, at::kFloat);
  }
  const double bias_correction1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
  const double bias_correction2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  const double step_size = p.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& stored_p = master != nullptr ? (*master)[i] : params[i];
    at::Tensor p32 = stored_p.to(at::kFloat);  // a copy for bf16 storage, the tensor itself for fp32
    at::Tensor m32 = exp_avg[i].to(at::kFloat);
    at::Tensor v32 = exp_avg_sq[i].to(at::kFloat);
    at::Tensor g32 = grads[i].defined() ? grads[i].to(at::kFloat) : at::zeros_like(p32);
    if (scale.defined()) g32 = g32 * scale.to(g32.device());

    // torch::optim::AdamW::step, line by line.
    if (p.weight_decay != 0) p32.mul_(1 - p.lr * p.weight_decay);
    m32.mul_(p.beta1).add_(g32, 1 - p.beta1);
    v32.mul_(p.beta2).addcmul_(g32, g32, 1 - p.beta2);
    at::Tensor denom = (v32.sqrt() / bias_correction2_sqrt).add_(p.eps);
    p32.addcdiv_(m32, denom, -step_size);

    // Write back (no-ops when the storage is fp32 and .to() returned the tensor itself).
    if (!p32.is_same(stored_p)) stored_p.copy_(p32);
    if (!m32.is_same(exp_avg[i])) exp_avg[i].copy_(m32);
    if (!v32.is_same(exp_avg_sq[i])) exp_avg_sq[i].copy_(v32);
    if (master != nullptr) params[i].copy_(p32);  // the bf16 model copy: the master rounded to nearest even
  }
}

namespace {

float to_float(float x) {
  return x;
}
float to_float(c10::BFloat16 x) {
  return static_cast<float>(x);
}
template <typename T>
T from_float(float x) {
  return static_cast<T>(x);  // c10::BFloat16 rounds to nearest even, as __float2bfloat16_rn
}

struct Int8Tensor {
  void* p;
  const void* g;  // null: zero gradient
  uint8_t *m, *v;
  float *m_absmax, *v_absmax;
  c10::BFloat16* model;  // fp32-master's bf16 copy, else null
  int64_t n;
};

template <typename P, typename G>
void int8_update(const Int8Tensor& t, const int8_math::UpdateScalars& us, float scale, const float* m_mid,
                 const float* v_mid) {
  const AdamwQuantMaps& maps = adamw_quant_maps();
  P* p = static_cast<P*>(t.p);
  const G* g = static_cast<const G*>(t.g);
  float mf[kAdamwQuantBlock], vf[kAdamwQuantBlock];
  for (int64_t b = 0; b < adamw_quant_blocks(t.n); ++b) {
    const int64_t first = b * kAdamwQuantBlock, count = std::min(kAdamwQuantBlock, t.n - first);
    float m_max = 0.f, v_max = 0.f;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t i = first + k;
      float pf = to_float(p[i]);
      const float gf = g != nullptr ? to_float(g[i]) : 0.f;
      mf[k] = int8_math::mul(maps.exp_avg[t.m[i]], t.m_absmax[b]);
      vf[k] = int8_math::mul(maps.exp_avg_sq[t.v[i]], t.v_absmax[b]);
      int8_math::adamw_element(pf, int8_math::mul(gf, scale), mf[k], vf[k], us);
      p[i] = from_float<P>(pf);
      if (t.model != nullptr) t.model[i] = c10::BFloat16(pf);
      m_max = std::fmax(m_max, std::fabs(mf[k]));
      v_max = std::fmax(v_max, vf[k]);
    }
    const float m_inv = int8_math::inverse_absmax(m_max), v_inv = int8_math::inverse_absmax(v_max);
    for (int64_t k = 0; k < count; ++k) {
      t.m[first + k] = int8_math::quantize_index(m_mid, int8_math::mul(mf[k], m_inv));
      t.v[first + k] = int8_math::quantize_index(v_mid, int8_math::mul(vf[k], v_inv));
    }
    t.m_absmax[b] = m_max;
    t.v_absmax[b] = v_max;
  }
}

}  // namespace

void adamw_step_int8_ref(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, AdamwInt8State& state,
                         std::vector<at::Tensor>* master, const AdamwParams& p, const at::Tensor& grad_scale) {
  float scale = static_cast<float>(p.grad_scale);
  if (grad_scale.defined()) {
    const float d = grad_scale.to(at::kCPU).to(at::kFloat).item<float>();
    if (!std::isfinite(d)) return;  // the kernel's skip
    scale = int8_math::mul(scale, d);
  }
  const AdamwStepScalars step = adamw_step_scalars(p);
  const int8_math::UpdateScalars us{static_cast<float>(p.beta1),
                                    static_cast<float>(1.0 - p.beta1),
                                    static_cast<float>(p.beta2),
                                    static_cast<float>(1.0 - p.beta2),
                                    static_cast<float>(p.eps),
                                    step.decay,
                                    step.step_size,
                                    step.bc2_sqrt};
  const AdamwQuantMaps& maps = adamw_quant_maps();
  float m_mid[256], v_mid[256];
  for (int k = 0; k < 256; ++k) {
    m_mid[k] = int8_math::code_midpoint(maps.exp_avg, k);
    v_mid[k] = int8_math::code_midpoint(maps.exp_avg_sq, k);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& stored = master != nullptr ? (*master)[i] : params[i];
    if (!stored.device().is_cpu())
      throw std::invalid_argument("adamw_step_int8_ref: params[" + std::to_string(i) + "] is not on the CPU");
    Int8Tensor t{stored.data_ptr(),
                 grads[i].defined() ? grads[i].const_data_ptr() : nullptr,
                 state.exp_avg[i].data_ptr<uint8_t>(),
                 state.exp_avg_sq[i].data_ptr<uint8_t>(),
                 state.exp_avg_absmax[i].data_ptr<float>(),
                 state.exp_avg_sq_absmax[i].data_ptr<float>(),
                 master != nullptr ? params[i].data_ptr<c10::BFloat16>() : nullptr,
                 stored.numel()};
    const bool bf16_grad = grads[i].defined() && grads[i].scalar_type() == at::kBFloat16;
    if (stored.scalar_type() == at::kBFloat16) {
      int8_update<c10::BFloat16, c10::BFloat16>(t, us, scale, m_mid, v_mid);
    } else if (bf16_grad) {
      int8_update<float, c10::BFloat16>(t, us, scale, m_mid, v_mid);
    } else {
      int8_update<float, float>(t, us, scale, m_mid, v_mid);
    }
  }
}

at::Tensor global_grad_norm_ref(const std::vector<at::Tensor>& grads) {
  at::Tensor total;
  for (const at::Tensor& g : grads) {
    if (!g.defined()) continue;
    at::Tensor ss = g.to(at::kFloat).square().sum();
    total = total.defined() ? total + ss : ss;
  }
  if (!total.defined()) return at::zeros({}, at::kFloat);
  return total.sqrt();
}

}  // namespace vlatune::kernels
