// What the torch side of the kernels (the *_autograd.cpp files, fp8_ops.cpp, adamw_dispatch.cpp, the attention
// wrappers) shares: checks that name the op and the tensor, the dense and aligned views the kernels read, the
// dtypes, the current stream, and the sum of a backward's fp32 partials into gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/act_dtype.h"

#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDAGuard.h>  // the kernel paths' device guard
#endif

namespace vlatune::kernels {

// "bf16 [32, 50, 1024] on cuda:0", or "an undefined tensor".
std::string describe(const at::Tensor& t);

// Throws std::invalid_argument "<op>: <what>, got <describe(t)>".
[[noreturn]] void fail(const std::string& op, const std::string& what, const at::Tensor& t);

// `t` (when defined) must have x's sizes, dtype and device; else fail(op, "<name> must match x (...)", t).
void check_like(const std::string& op, const char* name, const at::Tensor& t, const at::Tensor& x);

// True for an undefined tensor or one whose data starts on a 16-byte boundary (the kernels' vector accesses).
bool aligned16(const at::Tensor& t);

// Contiguous and 16-byte aligned: a view with an odd offset is copied. Undefined stays undefined.
at::Tensor dense(const at::Tensor& t);

// A custom autograd function rejects undefined tensor arguments: optional ones travel as std::optional.
std::optional<at::Tensor> optional_tensor(const at::Tensor& t);

// The kernels' dtype of bf16 (else fp32) activations.
ActDtype act_dtype(const at::Tensor& t);

// fp64 statistics for fp64 activations (exactness tests), fp32 for every other dtype.
at::ScalarType math_of(const at::Tensor& t);

// t in x's dtype (itself when it already is).
at::Tensor cast_like(const at::Tensor& t, const at::Tensor& x);

// [..., 1]: the shape of a per-row statistic kept for broadcasting.
std::vector<int64_t> keepdim_shape(const at::Tensor& t);

// The current CUDA stream of t's device (a CUDA build; nullptr otherwise).
CUstream_st* stream_of(const at::Tensor& t);

// y = act W^T (+ b) with no autograd node of its own (the forward GEMM of geglu_linear and gelu_linear), in the
// profiler scope `scope_fqn` (none when empty). Weight and bias are cast to act's dtype.
at::Tensor linear_in_scope(const at::Tensor& act, const at::Tensor& weight, const at::Tensor& bias,
                           const std::string& scope_fqn);

// The parameter gradients of that GEMM from its output gradient g [rows, N] and input act [rows, K]: dW = g^T act in
// the weight's dtype (when want_weight; act may then be undefined otherwise), db = bias_grad(g) in the bias's (when
// the bias is defined and want_bias). A frozen parameter (recipe `freeze`, LoRA's base weight) wants none.
std::pair<at::Tensor, at::Tensor> linear_param_grads(const at::Tensor& g, const at::Tensor& act,
                                                     const at::Tensor& weight, const at::Tensor& bias,
                                                     bool want_weight = true, bool want_bias = true);

// partials [rows, ...] fp32 -> their sum over rows [...] in `dtype`: one column_sums kernel for bf16 and fp32 CUDA
// tensors, ATen's sum and a cast otherwise.
at::Tensor sum_partials(const at::Tensor& partials, at::ScalarType dtype);

}  // namespace vlatune::kernels
