// Torch entry points of the fused AdamW and of the global gradient norm: inputs are checked (the messages name
// the list, the index, the expected and actual dtype/shape/device) and dispatched by device: CUDA tensors go to
// the fused kernels of adamw.cu (when built with CUDA), CPU tensors to the ATen reference of adamw_ref.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/adamw.h"

namespace vlatune::kernels {

// One AdamW update of every tensor, in place (semantics: adamw.h).
// Storage is inferred from the dtypes:
//   master == nullptr, params fp32: grads, exp_avg, exp_avg_sq fp32                         (AdamwStorage::kFp32)
//   master == nullptr, params bf16: grads, exp_avg, exp_avg_sq bf16                         (AdamwStorage::kBf16)
//   master != nullptr: (*master)[i] fp32 updated, params[i] bf16 written as its rounded copy,
//                      grads bf16, exp_avg/exp_avg_sq fp32                                  (AdamwStorage::kFp32Master)
// An undefined grads[i] is a zero gradient. Every defined tensor must be contiguous, on one device, with
// params[i]'s shape. `grad_scale`, when defined, is a 0-d fp32 tensor on that device multiplied into the gradients
// (with params.grad_scale); when it holds a non-finite value the update is skipped (nothing is written).
// Asynchronous on CUDA (current stream).
void adamw_step(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, std::vector<at::Tensor>& exp_avg,
                std::vector<at::Tensor>& exp_avg_sq, std::vector<at::Tensor>* master, const AdamwParams& params_in,
                const at::Tensor& grad_scale = {});

// The ATen reference (adamw_ref.cpp): same contract and math, plain tensor ops, fp32 internally, any device.
// adamw_step calls it for CPU tensors after checking them; tests call it directly for CUDA parity.
void adamw_step_ref(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    std::vector<at::Tensor>& exp_avg, std::vector<at::Tensor>& exp_avg_sq,
                    std::vector<at::Tensor>* master, const AdamwParams& params_in, const at::Tensor& grad_scale = {});

// The 8-bit blockwise AdamW state of a list of tensors (adamw.h, kAdamwQuantBlock): exp_avg[i] and exp_avg_sq[i]
// uint8 codes with params[i]'s shape; exp_avg_absmax[i] and exp_avg_sq_absmax[i] fp32 [adamw_quant_blocks(numel)].
// A fresh state is all zero absmax (every code then means 0).
struct AdamwInt8State {
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  std::vector<at::Tensor> exp_avg_absmax, exp_avg_sq_absmax;
};

// One AdamW update with 8-bit state, in place. Parameters, gradients and master weights as adamw_step (storage
// inferred the same way); the moments as AdamwInt8State. CUDA tensors: the fused kernel of adamw_int8.cu; CPU
// tensors: adamw_step_int8_ref. Asynchronous on CUDA (current stream).
void adamw_step_int8(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, AdamwInt8State& state,
                     std::vector<at::Tensor>* master, const AdamwParams& params_in, const at::Tensor& grad_scale = {});

// The reference of adamw_step_int8: a plain loop over CPU tensors, block by block, with the kernel's fp32
// operations (adamw_int8_math.h), so the kernel's results equal it bit for bit. CPU tensors only.
void adamw_step_int8_ref(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads, AdamwInt8State& state,
                         std::vector<at::Tensor>* master, const AdamwParams& params_in,
                         const at::Tensor& grad_scale = {});

// sqrt(sum over all grads of sum(g^2)), accumulated in fp32: a 0-d fp32 tensor on the grads' device (CPU when no
// grad is defined). Undefined tensors are skipped; fp32 and bf16 may be mixed. Fused multi-tensor kernel on CUDA
// (deterministic, no host sync); ATen on CPU.
at::Tensor global_grad_norm(const std::vector<at::Tensor>& grads);

// The ATen reference of global_grad_norm (any device).
at::Tensor global_grad_norm_ref(const std::vector<at::Tensor>& grads);

}  // namespace vlatune::kernels
