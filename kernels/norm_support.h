// The torch side shared by the RMSNorm and LayerNorm autograd nodes (rms_norm_autograd.cpp, layer_norm_autograd.cpp):
// their backward's incoming gradients and how their kernels read the weight.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>

#include "kernels/op_support.h"

namespace vlatune::kernels {

// A residual norm node's incoming gradients: of h (the residual stream output; undefined when unused) and of y (the
// norm output; zeros when unused), both dense, with h's width and rows.
struct NormBwdInputs {
  at::Tensor grad_h, grad_y;
  int64_t width, rows;
};
inline NormBwdInputs norm_bwd_inputs(const torch::autograd::variable_list& grads, const at::Tensor& h) {
  const int64_t width = h.size(-1);
  return {dense(grads[0]), dense(grads[1].defined() ? grads[1] : at::zeros_like(h)), width,
          h.numel() / std::max<int64_t>(width, 1)};
}

// True when a norm kernel reads parameter `t` as it is: in the activation dtype of `x`, dense and 16-byte aligned.
// Otherwise the kernel reads an fp32 copy (fp32-master: fp32 parameters, bf16 activations).
inline bool param_in_act_dtype(const at::Tensor& t, const at::Tensor& x) {
  return t.scalar_type() == x.scalar_type() && t.is_contiguous() && aligned16(t);
}

// Points a norm kernel at its weight: the fp32 copy `w32` when the forward made one, else `weight` itself
// (param_in_act_dtype).
template <typename Params>
void set_weight(Params& p, const at::Tensor& weight, const at::Tensor& w32) {
  p.weight = w32.defined() ? w32.const_data_ptr<float>() : nullptr;
  p.weight_t = w32.defined() ? nullptr : weight.const_data_ptr();
}

// The fields the RMSNorm and LayerNorm backward kernels share (w32 as for set_weight).
template <typename Params>
void fill_norm_bwd(Params& p, const NormBwdInputs& in, const at::Tensor& h, const at::Tensor& weight,
                   const at::Tensor& w32, const at::Tensor& rstd, at::Tensor& grad_x, at::Tensor& partials) {
  p.dtype = act_dtype(h);
  p.rows = in.rows;
  p.width = in.width;
  p.grad_y = in.grad_y.const_data_ptr();
  p.grad_h = in.grad_h.defined() ? in.grad_h.const_data_ptr() : nullptr;
  p.h = h.const_data_ptr();
  set_weight(p, weight, w32);
  p.rstd = rstd.const_data_ptr<float>();
  p.grad_x = grad_x.data_ptr();
  p.weight_partials = partials.data_ptr<float>();
}

}  // namespace vlatune::kernels
