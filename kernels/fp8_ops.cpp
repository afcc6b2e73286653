// Fused FP8 quantization: checks, dispatch by device (fp8_quant.cu on CUDA, the ATen reference elsewhere) and the
// FP8 GEMM (at::_scaled_mm, or cuBLASLt directly with timed algorithms; a dequantize-and-multiply emulation on the
// CPU). Contract: fp8_ops.h, fp8.h.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/column_sums.h"
#include "kernels/fp8_ops.h"
#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda_check.h"
#endif

namespace vlatune::kernels {

namespace {

[[noreturn]] void fail(const std::string& what, const at::Tensor& t) {
  kernels::fail("fp8_quantize", what, t);
}

bool kernel_applies(const at::Tensor& x) {
  return fused_kernels_apply(x);  // CUDA build, CUDA tensor, fp32 or bf16
}

void check_fp32_scalar(const char* name, const at::Tensor& t, const at::Tensor& x) {
  if (t.defined() && (t.scalar_type() != at::kFloat || t.numel() != 1 || t.device() != x.device()))
    fail(std::string(name) + " must be one fp32 element on " + x.device().str(), t);
}

// The outputs of a cast of a [rows, cols] tensor (x: its device, and named in messages).
void check_cast_outputs(int64_t rows, int64_t cols, const at::Tensor& x, Fp8Format format, const at::Tensor& amax_in,
                        const Fp8QuantOutputs& o) {
  if (!amax_in.defined() || amax_in.dim() != 1 || amax_in.numel() < 1 || amax_in.scalar_type() != at::kFloat ||
      !amax_in.is_contiguous() || amax_in.device() != x.device())
    fail("amax_in must be a contiguous 1-D fp32 tensor on " + x.device().str(), amax_in);
  const auto dt = fp8_dtype(format);
  if (o.out.defined() && (o.out.size(0) != rows || o.out.size(1) != cols || o.out.dim() != 2 ||
                          o.out.scalar_type() != dt || o.out.stride(1) != 1 || o.out.device() != x.device()))
    fail("out must be [rows, cols] " + std::string(c10::toString(dt)) + " with a contiguous last dim", o.out);
  if (o.out_t.defined() && (o.out_t.dim() != 2 || o.out_t.size(0) != cols || o.out_t.size(1) != rows ||
                            o.out_t.scalar_type() != dt || o.out_t.stride(1) != 1 || o.out_t.device() != x.device()))
    fail("out_t must be [cols, rows] " + std::string(c10::toString(dt)) + " with a contiguous last dim", o.out_t);
  check_fp32_scalar("amax_out", o.amax_out, x);
  check_fp32_scalar("inv_scale", o.inv_scale, x);
  check_fp32_scalar("amax_used", o.amax_used, x);
}

void check_outputs(const at::Tensor& x, Fp8Format format, const at::Tensor& amax_in, const Fp8QuantOutputs& o) {
  if (!x.defined() || x.dim() != 2 || !x.is_contiguous() || !at::isFloatingType(x.scalar_type()))
    fail("x must be a contiguous floating [rows, cols] tensor", x);
  if (x.size(0) % 16 != 0 || x.size(1) % 16 != 0) fail("rows and cols must be multiples of 16 (FP8 GEMM operands)", x);
  check_cast_outputs(x.size(0), x.size(1), x, format, amax_in, o);
}

#ifdef VLATUNE_HAVE_CUDA
// The amax history a cast's scale comes from, and its outputs.
void fill_history_and_outputs(Fp8QuantParams& p, const at::Tensor& amax_in, int64_t amax_skip,
                              const Fp8QuantOutputs& o) {
  p.amax_in = amax_in.const_data_ptr<float>();
  p.amax_count = static_cast<int>(amax_in.numel());
  p.amax_skip = static_cast<int>(amax_skip);
  if (o.out.defined()) p.out = o.out.data_ptr(), p.out_ld = o.out.stride(0);
  if (o.out_t.defined()) p.out_t = o.out_t.data_ptr(), p.out_t_ld = o.out_t.stride(0);
  p.amax_out = o.amax_out.defined() ? o.amax_out.data_ptr<float>() : nullptr;
  p.inv_scale_out = o.inv_scale.defined() ? o.inv_scale.data_ptr<float>() : nullptr;
  p.amax_used_out = o.amax_used.defined() ? o.amax_used.data_ptr<float>() : nullptr;
}

// The input of a cast: the [rows, cols] values x holds (cols: the GeGLU width when x is the merged GEMM output).
Fp8QuantParams input_params(const at::Tensor& x, Fp8Format format, int64_t cols) {
  Fp8QuantParams p;
  p.dtype = act_dtype(x);
  p.format = format;
  p.rows = x.size(0);
  p.cols = cols;
  p.x = x.const_data_ptr();
  return p;
}
#endif

}  // namespace

at::ScalarType fp8_dtype(Fp8Format f) {
  return f == Fp8Format::kE4m3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

void fp8_amax_into(const at::Tensor& x, const at::Tensor& amax) {
  if (!amax.defined() || amax.scalar_type() != at::kFloat || amax.numel() != 1 || amax.device() != x.device())
    fail("amax must be one fp32 element on x's device", amax);
  if (x.numel() == 0) return;
  if (kernel_applies(x)) {
#ifdef VLATUNE_HAVE_CUDA
    const at::Tensor xc = x.contiguous();
    const c10::cuda::CUDAGuard guard(x.device());
    Fp8AmaxParams p;
    p.dtype = act_dtype(xc);
    p.count = xc.numel();
    p.x = xc.const_data_ptr();
    p.amax_out = amax.data_ptr<float>();
    launch_fp8_amax(p, stream_of(x));
    return;
#endif
  }
  amax.copy_(at::maximum(amax.reshape({1}), x.abs().max().to(at::kFloat).reshape({1})).reshape(amax.sizes()));
}

void fp8_quantize_into_ref(const at::Tensor& x, Fp8Format format, const at::Tensor& amax_in, int64_t amax_skip,
                           const Fp8QuantOutputs& o) {
  check_outputs(x, format, amax_in, o);
  const float fmax = fp8_max_value(format);
  at::Tensor hist = amax_in;
  if (amax_skip >= 0 && amax_skip < amax_in.numel()) {
    hist = amax_in.clone();
    hist[amax_skip] = 0.0f;
  }
  const at::Tensor amax = hist.max();  // 0-dim fp32
  // fp32 arithmetic throughout, as the kernel: scale = fp8_max / amax (1 for 0 or non-finite), inv = 1 / scale.
  const at::Tensor ok = at::logical_and(amax > 0, at::isfinite(amax));
  const at::Tensor scale = at::where(ok, at::full({}, fmax, amax.options()) / amax, at::ones_like(amax));
  const at::Tensor q = (x.to(at::kFloat) * scale).clamp(-fmax, fmax).to(fp8_dtype(format));
  if (o.out.defined()) o.out.copy_(q);
  if (o.out_t.defined()) o.out_t.copy_(q.t());
  if (o.amax_out.defined()) fp8_amax_into(x, o.amax_out);
  if (o.inv_scale.defined())
    o.inv_scale.copy_((at::full({}, 1.0f, scale.options()) / scale).reshape(o.inv_scale.sizes()));
  if (o.amax_used.defined()) o.amax_used.copy_(amax.reshape(o.amax_used.sizes()));
}

void fp8_quantize_into(const at::Tensor& x, Fp8Format format, const at::Tensor& amax_in, int64_t amax_skip,
                       const Fp8QuantOutputs& o) {
  if (!kernel_applies(x)) return fp8_quantize_into_ref(x, format, amax_in, amax_skip, o);
  check_outputs(x, format, amax_in, o);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  Fp8QuantParams p = input_params(x, format, x.size(1));
  fill_history_and_outputs(p, amax_in, amax_skip, o);
  launch_fp8_quantize(p, stream_of(x));
#endif
}

namespace {

// pre [rows, F] contiguous floating with rows, F multiples of 16 (the cast kernel's tiles and the FP8 GEMMs).
void check_gelu_input(const at::Tensor& pre, const char* op) {
  if (!pre.defined() || pre.dim() != 2 || !pre.is_contiguous() || !at::isFloatingType(pre.scalar_type()) ||
      pre.size(1) % 16 != 0 || pre.size(0) % 16 != 0)
    throw std::invalid_argument(std::string(op) + ": pre must be a contiguous floating [rows, F] tensor with rows " +
                                "and F multiples of 16, got " + describe(pre));
}

// The fused cast kernels read 16-byte vectors of their input.
bool cast_kernel_applies(const at::Tensor& x) {
  return kernel_applies(x) && x.data_ptr() != nullptr && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

}  // namespace

void fp8_gelu_quantize_into(const at::Tensor& pre, const at::Tensor& amax_in, int64_t amax_skip,
                            const Fp8QuantOutputs& o) {
  const char* op = "fp8_gelu_quantize";
  check_gelu_input(pre, op);
  if (!cast_kernel_applies(pre)) return fp8_quantize_into(kernels::gelu(pre), Fp8Format::kE4m3, amax_in, amax_skip, o);
  check_cast_outputs(pre.size(0), pre.size(1), pre, Fp8Format::kE4m3, amax_in, o);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(pre.device());
  Fp8QuantParams p = input_params(pre, Fp8Format::kE4m3, pre.size(1));
  fill_history_and_outputs(p, amax_in, amax_skip, o);
  launch_fp8_gelu_quantize(p, stream_of(pre));
#endif
}

void fp8_gelu_amax_into(const at::Tensor& pre, const at::Tensor& amax) {
  check_gelu_input(pre, "fp8_gelu_amax");
  check_fp32_scalar("amax", amax, pre);
  if (!amax.defined()) fail("amax is required", amax);
  if (!cast_kernel_applies(pre)) return fp8_amax_into(kernels::gelu(pre), amax);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(pre.device());
  Fp8QuantParams p = input_params(pre, Fp8Format::kE4m3, pre.size(1));
  p.amax_out = amax.data_ptr<float>();  // no outputs: the amax pass only
  launch_fp8_gelu_quantize(p, stream_of(pre));
#endif
}

namespace {

// merged [rows, 2F] contiguous floating with rows, F multiples of 16 (the cast kernels' tiles and the FP8 GEMMs).
void check_merged(const at::Tensor& merged, const char* op) {
  if (!merged.defined() || merged.dim() != 2 || !merged.is_contiguous() || !at::isFloatingType(merged.scalar_type()) ||
      merged.size(1) % 32 != 0 || merged.size(0) % 16 != 0)
    throw std::invalid_argument(std::string(op) +
                                ": merged must be a contiguous floating [rows, 2F] tensor with rows and F " +
                                "multiples of 16, got " + describe(merged));
}

// Blocks of a merged [rows, 2F] on `device`.
void check_blocks(const GegluBlocks& b, int64_t rows, int64_t f, const c10::Device& device, const char* op) {
  if (!geglu_blocks_supported(f))
    throw std::invalid_argument(std::string(op) + ": e4m3 blocks need F a multiple of " + std::to_string(kGegluBlock) +
                                ", got F " + std::to_string(f));
  if (!b.data.defined() || b.data.dim() != 2 || b.data.size(0) != rows || b.data.size(1) != 2 * f ||
      !b.data.is_contiguous() || b.data.scalar_type() != at::kFloat8_e4m3fn || b.data.device() != device)
    fail("blocks.data must be a contiguous [" + std::to_string(rows) + ", " + std::to_string(2 * f) +
             "] Float8_e4m3fn tensor on " + device.str(),
         b.data);
  if (!b.inv_scale.defined() || b.inv_scale.dim() != 2 || b.inv_scale.size(0) != 2 * f / kGegluBlock ||
      b.inv_scale.size(1) != rows || !b.inv_scale.is_contiguous() || b.inv_scale.scalar_type() != at::kFloat ||
      b.inv_scale.device() != device)
    fail("blocks.inv_scale must be a contiguous [" + std::to_string(2 * f / kGegluBlock) + ", " + std::to_string(rows) +
             "] fp32 tensor on " + device.str(),
         b.inv_scale);
}

}  // namespace

bool geglu_blocks_supported(int64_t f) {
  return f > 0 && f % kGegluBlock == 0;
}

GegluBlocks geglu_blocks_like(const at::Tensor& merged) {
  GegluBlocks b;
  b.data = at::empty({merged.size(0), merged.size(1)}, merged.options().dtype(at::kFloat8_e4m3fn));
  b.inv_scale = at::empty({merged.size(1) / kGegluBlock, merged.size(0)}, merged.options().dtype(at::kFloat));
  return b;
}

void geglu_blocks_quantize_ref(const at::Tensor& merged, const GegluBlocks& out) {
  const char* op = "geglu_blocks_quantize";
  check_merged(merged, op);
  const int64_t rows = merged.size(0), n = merged.size(1), nb = n / kGegluBlock;
  check_blocks(out, rows, n / 2, merged.device(), op);
  // fp32 arithmetic, as the kernel: scale = 448 / amax (1 for 0 or non-finite), inv = 1 / scale.
  const float fmax = fp8_max_value(Fp8Format::kE4m3);
  const at::Tensor x = merged.to(at::kFloat).reshape({rows, nb, kGegluBlock});
  const at::Tensor amax = x.abs().amax(-1, /*keepdim=*/true);
  const at::Tensor ok = at::logical_and(amax > 0, at::isfinite(amax));
  const at::Tensor scale = at::where(ok, at::full({}, fmax, amax.options()) / amax, at::ones_like(amax));
  out.data.copy_((x * scale).clamp(-fmax, fmax).to(at::kFloat8_e4m3fn).reshape({rows, n}));
  out.inv_scale.copy_((at::full({}, 1.0f, scale.options()) / scale).reshape({rows, nb}).t());
}

at::Tensor geglu_blocks_dequantize(const GegluBlocks& b, at::ScalarType dtype) {
  const int64_t rows = b.data.size(0), n = b.data.size(1), nb = n / kGegluBlock;
  check_blocks(b, rows, n / 2, b.data.device(), "geglu_blocks_dequantize");
  return (b.data.to(at::kFloat).reshape({rows, nb, kGegluBlock}) * b.inv_scale.t().reshape({rows, nb, 1}))
      .reshape({rows, n})
      .to(dtype);
}

void fp8_geglu_quantize_into(const at::Tensor& merged, const at::Tensor& amax_in, int64_t amax_skip,
                             const Fp8QuantOutputs& o, const GegluBlocks& blocks) {
  const char* op = "fp8_geglu_quantize";
  check_merged(merged, op);
  const int64_t f = merged.size(1) / 2;
  if (blocks.defined()) check_blocks(blocks, merged.size(0), f, merged.device(), op);
  if (!cast_kernel_applies(merged) || (blocks.defined() && !aligned16(blocks.data))) {
    fp8_quantize_into_ref(geglu(merged), Fp8Format::kE4m3, amax_in, amax_skip, o);
    if (blocks.defined()) geglu_blocks_quantize_ref(merged, blocks);
    return;
  }
  check_cast_outputs(merged.size(0), f, merged, Fp8Format::kE4m3, amax_in, o);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(merged.device());
  Fp8QuantParams p = input_params(merged, Fp8Format::kE4m3, f);
  fill_history_and_outputs(p, amax_in, amax_skip, o);
  if (blocks.defined()) {
    p.blocks_out = blocks.data.data_ptr();
    p.blocks_inv_scale_out = blocks.inv_scale.data_ptr<float>();
  }
  launch_fp8_geglu_quantize(p, stream_of(merged));
#endif
}

void fp8_geglu_amax_into(const at::Tensor& merged, const at::Tensor& amax) {
  check_merged(merged, "fp8_geglu_amax");
  check_fp32_scalar("amax", amax, merged);
  if (!amax.defined()) fail("amax is required", amax);
  if (!cast_kernel_applies(merged)) return fp8_amax_into(geglu(merged), amax);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(merged.device());
  Fp8QuantParams p = input_params(merged, Fp8Format::kE4m3, merged.size(1) / 2);
  p.amax_out = amax.data_ptr<float>();  // no outputs: the amax pass only
  launch_fp8_geglu_quantize(p, stream_of(merged));
#endif
}

namespace {

// A backward cast's rebuilt activation: act_t [F, rows] e4m3 and its inverse scale (either may be undefined), cast
// with act_amax; x names the device.
void check_rebuilt_act(const at::Tensor& act_t, const at::Tensor& act_inv_scale, const at::Tensor& act_amax,
                       int64_t rows, int64_t f, const at::Tensor& x) {
  if (act_t.defined() &&
      (act_t.dim() != 2 || act_t.size(0) != f || act_t.size(1) != rows || act_t.scalar_type() != at::kFloat8_e4m3fn ||
       act_t.stride(1) != 1 || act_t.device() != x.device()))
    fail("act_t must be [F, rows] Float8_e4m3fn with a contiguous last dim", act_t);
  if ((act_t.defined() || act_inv_scale.defined()) &&
      (!act_amax.defined() || act_amax.numel() != 1 || act_amax.scalar_type() != at::kFloat ||
       act_amax.device() != x.device()))
    fail("act_amax must be one fp32 element on " + x.device().str(), act_amax);
  check_fp32_scalar("act_inv_scale", act_inv_scale, x);
}

// The reference of that activation's outputs: act() [rows, F] cast transposed to e4m3 with act_amax, computed only
// when an output is wanted.
template <typename Act>
void rebuilt_act_ref(const at::Tensor& act_t, const at::Tensor& act_inv_scale, const at::Tensor& act_amax,
                     const Act& act) {
  if (!act_t.defined() && !act_inv_scale.defined()) return;
  Fp8QuantOutputs a;
  a.out_t = act_t;
  a.inv_scale = act_inv_scale;
  fp8_quantize_into_ref(act(), Fp8Format::kE4m3, act_amax.reshape({1}), -1, a);
}

#ifdef VLATUNE_HAVE_CUDA
// The same outputs as a backward cast kernel's params (Fp8GegluBwdParams, Fp8GeluBwdParams).
template <typename Params>
void fill_rebuilt_act(Params& p, const at::Tensor& act_t, const at::Tensor& act_inv_scale, const at::Tensor& act_amax) {
  if (act_t.defined()) p.act_t = act_t.data_ptr(), p.act_t_ld = act_t.stride(0);
  if (act_amax.defined()) p.act_amax_in = act_amax.const_data_ptr<float>();
  p.act_inv_scale_out = act_inv_scale.defined() ? act_inv_scale.data_ptr<float>() : nullptr;
}
#endif

void check_grad(const at::Tensor& grad, const at::Tensor& merged, const char* op) {
  check_merged(merged, op);
  if (!grad.defined() || grad.dim() != 2 || !grad.is_contiguous() || grad.scalar_type() != merged.scalar_type() ||
      grad.size(0) != merged.size(0) || grad.size(1) * 2 != merged.size(1) || grad.device() != merged.device())
    throw std::invalid_argument(std::string(op) + ": grad must be contiguous [rows, F] like merged (" +
                                describe(merged) + "), got " + describe(grad));
}

// The GeGLU input of a backward cast: merged, or its e4m3 blocks with `merged` undefined. Checks either against
// grad and returns merged's [rows, 2F] values for the reference path when `values` (dequantized from the blocks).
at::Tensor backward_input(const at::Tensor& grad, const at::Tensor& merged, const GegluBlocks& blocks, const char* op,
                          bool values) {
  if (!blocks.defined()) {
    check_grad(grad, merged, op);
    return merged;
  }
  if (merged.defined()) throw std::invalid_argument(std::string(op) + ": merged or its e4m3 blocks, not both");
  if (!grad.defined() || grad.dim() != 2 || !grad.is_contiguous() || !at::isFloatingType(grad.scalar_type()) ||
      grad.size(0) % 16 != 0 || grad.size(1) % 16 != 0)
    throw std::invalid_argument(std::string(op) +
                                ": grad must be a contiguous floating [rows, F] tensor with rows "
                                "and F multiples of 16, got " +
                                describe(grad));
  check_blocks(blocks, grad.size(0), grad.size(1), grad.device(), op);
  return values ? geglu_blocks_dequantize(blocks, grad.scalar_type()) : at::Tensor();
}

bool backward_kernel_applies(const at::Tensor& grad, const at::Tensor& merged, const GegluBlocks& blocks) {
  if (blocks.defined()) return cast_kernel_applies(grad) && aligned16(blocks.data);
  return cast_kernel_applies(merged) && cast_kernel_applies(grad);
}

#ifdef VLATUNE_HAVE_CUDA
Fp8GegluBwdParams geglu_bwd_params(const at::Tensor& grad, const at::Tensor& merged, const GegluBlocks& blocks,
                                   Fp8Format format) {
  Fp8GegluBwdParams p;
  if (blocks.defined()) {
    p.grad_merged = input_params(grad, format, grad.size(1));
    p.grad_merged.x = nullptr;  // merged comes from its blocks
    p.merged_blocks = blocks.data.const_data_ptr();
    p.merged_blocks_inv_scale = blocks.inv_scale.const_data_ptr<float>();
  } else {
    p.grad_merged = input_params(merged, format, merged.size(1) / 2);
  }
  p.grad = grad.const_data_ptr();
  return p;
}
#endif

}  // namespace

void fp8_geglu_backward_quantize_into(const at::Tensor& grad, const at::Tensor& merged_in, Fp8Format format,
                                      const at::Tensor& amax_in, int64_t amax_skip, const at::Tensor& act_amax,
                                      const Fp8GegluGradOutputs& o, const GegluBlocks& blocks) {
  const char* op = "fp8_geglu_backward_quantize";
  const bool kernel = backward_kernel_applies(grad, merged_in, blocks);
  const at::Tensor merged = backward_input(grad, merged_in, blocks, op, !kernel);
  const int64_t rows = grad.size(0), f = grad.size(1);
  check_cast_outputs(rows, 2 * f, grad, format, amax_in, o.grad_merged);
  check_rebuilt_act(o.act_t, o.act_inv_scale, act_amax, rows, f, grad);
  if (!kernel) {
    fp8_quantize_into_ref(geglu_backward(grad, merged), format, amax_in, amax_skip, o.grad_merged);
    rebuilt_act_ref(o.act_t, o.act_inv_scale, act_amax, [&] { return geglu(merged); });
    return;
  }
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(grad.device());
  Fp8GegluBwdParams p = geglu_bwd_params(grad, merged, blocks, format);
  fill_history_and_outputs(p.grad_merged, amax_in, amax_skip, o.grad_merged);
  fill_rebuilt_act(p, o.act_t, o.act_inv_scale, act_amax);
  launch_fp8_geglu_backward_quantize(p, stream_of(grad));
#endif
}

void fp8_geglu_backward_amax_into(const at::Tensor& grad, const at::Tensor& merged_in, const at::Tensor& amax,
                                  const GegluBlocks& blocks) {
  const char* op = "fp8_geglu_backward_amax";
  const bool kernel = backward_kernel_applies(grad, merged_in, blocks);
  const at::Tensor merged = backward_input(grad, merged_in, blocks, op, !kernel);
  if (!amax.defined()) fail("amax is required", amax);
  check_fp32_scalar("amax", amax, grad);
  if (!kernel) return fp8_amax_into(geglu_backward(grad, merged), amax);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(grad.device());
  Fp8GegluBwdParams p = geglu_bwd_params(grad, merged, blocks, Fp8Format::kE5m2);
  p.grad_merged.amax_out = amax.data_ptr<float>();  // no outputs: the amax pass only
  launch_fp8_geglu_backward_quantize(p, stream_of(grad));
#endif
}

namespace {

void check_gelu_grad(const at::Tensor& grad, const at::Tensor& pre, const char* op) {
  check_gelu_input(pre, op);
  if (!grad.defined() || grad.dim() != 2 || !grad.is_contiguous() || grad.scalar_type() != pre.scalar_type() ||
      grad.sizes() != pre.sizes() || grad.device() != pre.device())
    throw std::invalid_argument(std::string(op) + ": grad must be contiguous and like pre (" + describe(pre) +
                                "), got " + describe(grad));
}

// gelu_backward without the activation rebuilt (grad is only read).
at::Tensor gelu_grad_values(const at::Tensor& grad, const at::Tensor& pre) {
  at::Tensor g = grad;
  return kernels::gelu_backward(g, pre);
}

#ifdef VLATUNE_HAVE_CUDA
Fp8GeluBwdParams gelu_bwd_params(const at::Tensor& grad, const at::Tensor& pre, Fp8Format format) {
  Fp8GeluBwdParams p;
  p.grad_pre = input_params(pre, format, pre.size(1));
  p.grad = grad.const_data_ptr();
  return p;
}
#endif

}  // namespace

void fp8_gelu_backward_quantize_into(const at::Tensor& grad, const at::Tensor& pre, Fp8Format format,
                                     const at::Tensor& amax_in, int64_t amax_skip, const at::Tensor& act_amax,
                                     const Fp8GeluGradOutputs& o) {
  const char* op = "fp8_gelu_backward_quantize";
  check_gelu_grad(grad, pre, op);
  const int64_t rows = pre.size(0), f = pre.size(1);
  check_cast_outputs(rows, f, pre, format, amax_in, o.grad_pre);
  check_rebuilt_act(o.act_t, o.act_inv_scale, act_amax, rows, f, pre);
  if (o.bias_grad.defined() && (o.bias_grad.dim() != 1 || o.bias_grad.size(0) != f || !o.bias_grad.is_contiguous() ||
                                o.bias_grad.scalar_type() != pre.scalar_type() || o.bias_grad.device() != pre.device()))
    fail("bias_grad must be a contiguous [F] tensor of pre's dtype on " + pre.device().str(), o.bias_grad);
  if (!(cast_kernel_applies(pre) && cast_kernel_applies(grad))) {
    const at::Tensor grad_pre = gelu_grad_values(grad, pre);
    fp8_quantize_into_ref(grad_pre, format, amax_in, amax_skip, o.grad_pre);
    rebuilt_act_ref(o.act_t, o.act_inv_scale, act_amax, [&] { return kernels::gelu(pre); });
    if (o.bias_grad.defined()) o.bias_grad.copy_(kernels::bias_grad(grad_pre, pre.scalar_type()));
    return;
  }
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(pre.device());
  Fp8GeluBwdParams p = gelu_bwd_params(grad, pre, format);
  fill_history_and_outputs(p.grad_pre, amax_in, amax_skip, o.grad_pre);
  fill_rebuilt_act(p, o.act_t, o.act_inv_scale, act_amax);
  at::Tensor partials;
  if (o.bias_grad.defined()) {
    const int64_t partial_rows = (rows + kGeluBwdPartialRows - 1) / kGeluBwdPartialRows;
    partials = at::empty({partial_rows, f}, pre.options().dtype(at::kFloat));
    p.bias_partials = partials.data_ptr<float>();
  }
  launch_fp8_gelu_backward_quantize(p, stream_of(pre));
  if (partials.defined()) {
    ColumnSumParams sums;
    sums.dtype = act_dtype(pre);
    sums.rows = partials.size(0);
    sums.cols = f;
    sums.partials = partials.const_data_ptr<float>();
    sums.out = o.bias_grad.data_ptr();
    launch_column_sums(sums, stream_of(pre));
  }
#endif
}

void fp8_gelu_backward_amax_into(const at::Tensor& grad, const at::Tensor& pre, const at::Tensor& amax) {
  const char* op = "fp8_gelu_backward_amax";
  check_gelu_grad(grad, pre, op);
  if (!amax.defined()) fail("amax is required", amax);
  check_fp32_scalar("amax", amax, pre);
  if (!(cast_kernel_applies(pre) && cast_kernel_applies(grad))) return fp8_amax_into(gelu_grad_values(grad, pre), amax);
#ifdef VLATUNE_HAVE_CUDA
  const c10::cuda::CUDAGuard guard(pre.device());
  Fp8GeluBwdParams p = gelu_bwd_params(grad, pre, Fp8Format::kE5m2);
  p.grad_pre.amax_out = amax.data_ptr<float>();  // no outputs: the amax pass only
  launch_fp8_gelu_backward_quantize(p, stream_of(pre));
#endif
}

Fp8Tensor fp8_quantize(const at::Tensor& x_in, Fp8Format format, bool row_major, bool transposed) {
  const at::Tensor x = x_in.contiguous();
  if (x.dim() != 2) fail("x must be [rows, cols]", x);
  const auto f32 = x.options().dtype(at::kFloat);
  const auto q8 = x.options().dtype(fp8_dtype(format));
  Fp8Tensor t;
  t.amax_used = at::zeros({1}, f32);
  t.inv_scale = at::empty({}, f32);
  fp8_amax_into(x, t.amax_used);
  Fp8QuantOutputs o;
  if (row_major) t.data = o.out = at::empty({x.size(0), x.size(1)}, q8);
  if (transposed) t.data_t = o.out_t = at::empty({x.size(1), x.size(0)}, q8);
  o.inv_scale = t.inv_scale;
  fp8_quantize_into(x, format, t.amax_used, -1, o);
  return t;
}

#ifdef VLATUNE_HAVE_CUDA
namespace {

cudaDataType_t lt_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn:
      return CUDA_R_8F_E4M3;
    case at::kFloat8_e5m2:
      return CUDA_R_8F_E5M2;
    case at::kBFloat16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}
const char* lt_name(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn ? "e4m3" : t == at::kFloat8_e5m2 ? "e5m2" : t == at::kBFloat16 ? "bf16" : "fp32";
}

// The cuBLASLt descriptors of one FP8 GEMM in cuBLAS's column-major terms, D [m x n] = A^T B with A stored [k x m]
// (lda) and B [k x n] (ldb), the only FP8 layout Hopper's kernels take; destroyed with the object.
struct LtGemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  LtGemm() = default;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
  }
  bool create(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, at::ScalarType ta, at::ScalarType tb,
              at::ScalarType td, bool fast_accum, const void* bias, const float* a_scale, const float* b_scale) {
    const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
    const int8_t fast = fast_accum ? 1 : 0;
    bool ok = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              set(CUBLASLT_MATMUL_DESC_TRANSA, op_a) && set(CUBLASLT_MATMUL_DESC_TRANSB, op_b) &&
              set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast) && set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale) &&
              set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    if (ok && bias != nullptr) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_16BF;
      ok = set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue) && set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type) &&
           set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    }
    return ok && cublasLtMatrixLayoutCreate(&a, lt_dtype(ta), k, m, lda) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&b, lt_dtype(tb), k, n, ldb) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutCreate(&d, lt_dtype(td), m, n, m) == CUBLAS_STATUS_SUCCESS;
  }
  template <typename V>
  bool set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    return cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS;
  }
};

struct TimedChoice {
  Fp8TimedGemm record;
  cublasLtMatmulAlgo_t algo{};
};
// A GEMM problem as cuBLASLt sees it: device, m, n, k, lda, ldb (each through size_bucket), the dtypes of A, B and
// D, fast accumulation, bias.
using ProblemKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, bool, bool>;
struct TimedGemms {
  std::mutex mutex;
  std::map<ProblemKey, size_t> by_key;  // -> choices index
  std::vector<TimedChoice> choices;
};
TimedGemms& timed_gemms_state() {
  static TimedGemms state;
  return state;
}

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// The backbone's prefix stream keeps each batch's live rows (model::live_prefix_rows), so a dimension that counts
// rows changes from step to step; timing every new row count would synchronize the device in every step. Dimensions
// of 8192 or more are keyed by their multiple of 2048 instead: a new row count reuses its bucket's choice (cuBLASLt
// checks that the algorithm takes the problem; a refusal falls back to at::_scaled_mm). The model's own widths up
// to 16384 are multiples of 2048 or below 8192, so they keep their exact key.
int64_t size_bucket(int64_t x) {
  return x >= 8192 ? (x + 2047) / 2048 * 2048 : x;
}

// The median of three runs after one warm-up, on the stream; +inf when cuBLASLt refuses the candidate.
float time_candidate(const std::function<cublasStatus_t()>& run, cudaStream_t stream) {
  if (run() != CUBLAS_STATUS_SUCCESS) return std::numeric_limits<float>::infinity();
  cudaEvent_t start = nullptr, stop = nullptr;
  VLATUNE_CUDA_CHECK(cudaEventCreate(&start));
  VLATUNE_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < 3; ++r) {
    VLATUNE_CUDA_CHECK(cudaEventRecord(start, stream));
    const cublasStatus_t status = run();
    VLATUNE_CUDA_CHECK(cudaEventRecord(stop, stream));
    VLATUNE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    VLATUNE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(status == CUBLAS_STATUS_SUCCESS ? t : std::numeric_limits<float>::infinity());
  }
  VLATUNE_CUDA_CHECK(cudaEventDestroy(start));
  VLATUNE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[1];
}

// fp8_mm's kTimed path: a [m, k] row-major, b [k, n] column-major -> [m, n] row-major, or an undefined tensor where
// it does not apply (the caller runs at::_scaled_mm). In cuBLAS's terms D [n x m] = b^T a: A = b, B = a.
at::Tensor timed_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& inv_a, const at::Tensor& inv_b,
                           at::ScalarType out_dtype, bool fast_accum, const at::Tensor& bias_bf16) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (a.stride(1) != 1 || b.stride(0) != 1 || a.stride(0) < k || b.stride(1) < k ||
      (out_dtype != at::kBFloat16 && out_dtype != at::kFloat) || !inv_a.is_contiguous() || !inv_b.is_contiguous())
    return {};
  const int64_t lda = b.stride(1), ldb = a.stride(0);
  const c10::cuda::CUDAGuard guard(a.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  LtGemm gemm;
  if (!gemm.create(n, m, k, lda, ldb, b.scalar_type(), a.scalar_type(), out_dtype, fast_accum,
                   bias_bf16.defined() ? bias_bf16.data_ptr() : nullptr, inv_b.data_ptr<float>(),
                   inv_a.data_ptr<float>()))
    return {};
  at::Tensor y = at::empty({m, n}, a.options().dtype(out_dtype));
  at::Tensor workspace = at::empty({static_cast<int64_t>(kLtWorkspaceBytes)}, a.options().dtype(at::kByte));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const float one = 1.f, zero = 0.f;
  const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle, gemm.desc, &one, b.data_ptr(), gemm.a, a.data_ptr(), gemm.b, &zero, y.data_ptr(),
                          gemm.d, y.data_ptr(), gemm.d, &algo, workspace.data_ptr(), kLtWorkspaceBytes, stream);
  };
  const ProblemKey key{a.get_device(),
                       size_bucket(n),
                       size_bucket(m),
                       size_bucket(k),
                       size_bucket(lda),
                       size_bucket(ldb),
                       static_cast<int>(b.scalar_type()),
                       static_cast<int>(a.scalar_type()),
                       static_cast<int>(out_dtype),
                       fast_accum,
                       bias_bf16.defined()};
  TimedGemms& state = timed_gemms_state();
  const std::lock_guard<std::mutex> lock(state.mutex);
  auto found = state.by_key.find(key);
  if (found == state.by_key.end()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    VLATUNE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return {};  // timing synchronizes: not inside a graph capture
    TimedChoice choice;
    choice.record.problem = "m=" + std::to_string(n) + " n=" + std::to_string(m) + " k=" + std::to_string(k) +
                            " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) + " " +
                            lt_name(b.scalar_type()) + " x " + lt_name(a.scalar_type()) + " -> " + lt_name(out_dtype) +
                            (fast_accum ? " fast-accum" : "") + (bias_bf16.defined() ? " bias" : "") +
                            " cuda:" + std::to_string(a.get_device());
    cublasLtMatmulPreference_t preference = nullptr;
    std::vector<cublasLtMatmulHeuristicResult_t> candidates(kFp8TimedCandidates);
    int count = 0;
    size_t workspace_bytes = kLtWorkspaceBytes;
    if (cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS) {
      if (cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof(workspace_bytes)) != CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoGetHeuristic(handle, gemm.desc, gemm.a, gemm.b, gemm.d, gemm.d, preference,
                                         kFp8TimedCandidates, candidates.data(), &count) != CUBLAS_STATUS_SUCCESS)
        count = 0;
      cublasLtMatmulPreferenceDestroy(preference);
    }
    for (int i = 0; i < count; ++i) {
      const float ms = time_candidate([&] { return run(candidates[static_cast<size_t>(i)].algo); }, stream);
      choice.record.candidate_ms.push_back(ms);
      if (std::isfinite(ms) &&
          (choice.record.chosen < 0 || ms < choice.record.candidate_ms[static_cast<size_t>(choice.record.chosen)])) {
        choice.record.chosen = i;
        choice.algo = candidates[static_cast<size_t>(i)].algo;
      }
    }
    found = state.by_key.emplace(key, state.choices.size()).first;
    state.choices.push_back(choice);
  }
  TimedChoice& choice = state.choices[found->second];
  ++choice.record.calls;
  if (choice.record.chosen < 0 || run(choice.algo) != CUBLAS_STATUS_SUCCESS) return {};
  return y;
}

}  // namespace

std::vector<Fp8TimedGemm> fp8_timed_gemms() {
  TimedGemms& state = timed_gemms_state();
  const std::lock_guard<std::mutex> lock(state.mutex);
  std::vector<Fp8TimedGemm> out;
  for (const TimedChoice& c : state.choices) out.push_back(c.record);
  return out;
}
#else
std::vector<Fp8TimedGemm> fp8_timed_gemms() {
  return {};
}
#endif

std::string describe_fp8_timed_gemms(const std::vector<Fp8TimedGemm>& timed, int64_t steps) {
  if (timed.empty()) return {};
  int64_t moved = 0;
  double saved_ms = 0;
  for (const Fp8TimedGemm& t : timed) {
    if (t.chosen <= 0 || t.candidate_ms.empty()) continue;
    ++moved;
    saved_ms += (t.candidate_ms.front() - t.candidate_ms[static_cast<size_t>(t.chosen)]) * static_cast<double>(t.calls);
  }
  char saved[32];
  std::snprintf(saved, sizeof saved, "%.2f", saved_ms / static_cast<double>(std::max<int64_t>(steps, 1)));
  return "fp8.gemm_algorithm timed: " + std::to_string(timed.size()) + " FP8 GEMM problems, " + std::to_string(moved) +
         " on another algorithm than cuBLASLt's first choice, about " + saved +
         " ms less per step by their first-call timings";
}

at::Tensor fp8_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& inv_a, const at::Tensor& inv_b,
                  at::ScalarType out_dtype, bool fast_accum, const at::Tensor& bias, Fp8GemmAlgorithm algorithm) {
  static_cast<void>(algorithm);  // CUDA builds only
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0))
    throw std::invalid_argument("fp8_mm: expected a [m, k] and b [k, n], got " + describe(a) + " and " + describe(b));
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != b.size(1)))
    throw std::invalid_argument("fp8_mm: bias " + describe(bias) + " for " + describe(b));
  if (a.is_cuda()) {
    if (a.size(1) % 16 != 0 || b.size(1) % 16 != 0)
      throw std::invalid_argument("fp8_mm: k and n must be multiples of 16 for cuBLASLt's FP8 GEMMs, got " +
                                  describe(a) + " and " + describe(b));
    // cuBLASLt's FP8 epilogue takes a bias for bf16 outputs only (a bf16 bias).
    const bool epilogue = bias.defined() && out_dtype == at::kBFloat16;
    const at::Tensor bias_bf16 = epilogue ? bias.to(at::kBFloat16).contiguous() : at::Tensor();
    at::Tensor y;
#ifdef VLATUNE_HAVE_CUDA
    if (algorithm == Fp8GemmAlgorithm::kTimed)
      y = timed_scaled_mm(a, b, inv_a, inv_b, out_dtype, fast_accum, bias_bf16);
#endif
    if (!y.defined())
      y = at::_scaled_mm(a, b, inv_a.reshape({}), inv_b.reshape({}),
                         epilogue ? std::optional<at::Tensor>(bias_bf16) : std::nullopt, std::nullopt, out_dtype,
                         fast_accum);
    if (bias.defined() && !epilogue) y.add_(bias.to(out_dtype));
    return y;
  }
  at::Tensor y = (a.to(at::kFloat) * inv_a.reshape({})).mm(b.to(at::kFloat) * inv_b.reshape({}));
  if (bias.defined()) y.add_(bias.to(at::kFloat));
  return y.to(out_dtype);
}

}  // namespace vlatune::kernels
