// Fused multi-tensor AdamW and the fused squared-L2 norm used for global-norm clipping: torch-free params and
// raw-pointer launchers (kernels in adamw.cu, the 8-bit-state kernel in adamw_int8.cu; the references in
// adamw_ref.cpp; checks and dispatch by device in adamw_dispatch.cpp, declared in adamw_ops.h). Design note:
// adamw.md.
//
// Semantics are torch.optim.AdamW's (decoupled weight decay, bias correction), all math in fp32:
//   g  = grad * grad_scale                       (grad_scale = clip coefficient, read on the device)
//   p *= 1 - lr * weight_decay
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// A device grad_scale that is not finite means "skip": the kernel writes nothing (the non-finite guard costs no
// host sync before the update).
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t without <cuda_runtime.h>: this header is included by CPU-only builds

namespace vlatune::kernels {

// How parameters, gradients and AdamW state are stored. Math is fp32 in every mode.
enum class AdamwStorage {
  kFp32,        // fp32 params, fp32 grads, fp32 exp_avg/exp_avg_sq (tests, CPU parity, fp32 models)
  kBf16,        // bf16 params, bf16 grads, bf16 exp_avg/exp_avg_sq (recipe precision "bf16", as openpi-PT)
  kFp32Master,  // fp32 master params + fp32 exp_avg/exp_avg_sq, bf16 grads; also writes the bf16 model copy
};

const char* adamw_storage_name(AdamwStorage storage);

// Hyper-parameters of one update. Host doubles; the launcher rounds them to fp32 once.
struct AdamwParams {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 1e-10;
  int64_t step = 1;         // 1-based number of this update, for bias correction (torch's state['step'] after +1)
  double grad_scale = 1.0;  // host factor multiplied into every gradient
  // Optional device fp32 scalar multiplied into every gradient as well (the clip coefficient computed on the
  // device from the fused norm). Non-finite = skip the update. nullptr = 1.
  const float* grad_scale_device = nullptr;
  // Optional device fp32[3] read at run time instead of the values derived from lr, weight_decay and step:
  // {1 - lr * weight_decay, lr / (1 - beta1^step), sqrt(1 - beta2^step)} (adamw_step_scalars). A captured CUDA
  // graph replays its launch with the parameters of the capture; the host rewrites these before each replay.
  const float* step_scalars_device = nullptr;
};

// The per-step scalars of an update, rounded to fp32 once from doubles (as torch passes them as Scalars): what
// the launcher computes from `params`, and what step_scalars_device must hold to give the same update.
struct AdamwStepScalars {
  float decay = 1.0f;      // 1 - lr * weight_decay
  float step_size = 0.0f;  // lr / (1 - beta1^step)
  float bc2_sqrt = 1.0f;   // sqrt(1 - beta2^step)
};
AdamwStepScalars adamw_step_scalars(const AdamwParams& params);

// One list of tensors for the multi-tensor AdamW. Arrays of `count` raw device pointers, all contiguous.
//   kFp32:       params float*,  grads float*,         exp_avg/exp_avg_sq float*,         model_bf16 unused
//   kBf16:       params bf16*,   grads bf16*,          exp_avg/exp_avg_sq bf16*,          model_bf16 unused
//   kFp32Master: params float* (master), grads bf16*,  exp_avg/exp_avg_sq float*,         model_bf16 bf16* (written)
// A null grads[i] is a zero gradient (a parameter without a gradient this step: the update still decays m/v
// and applies weight decay, as optax does for a zero gradient).
struct AdamwTensorList {
  void* const* params = nullptr;
  const void* const* grads = nullptr;
  void* const* exp_avg = nullptr;
  void* const* exp_avg_sq = nullptr;
  void* const* model_bf16 = nullptr;
  // 8-bit state only (launch_adamw_int8_multi_tensor): exp_avg/exp_avg_sq hold uint8 codes and these fp32
  // [adamw_quant_blocks(numel)] arrays the absmax of each block.
  float* const* exp_avg_absmax = nullptr;
  float* const* exp_avg_sq_absmax = nullptr;
  const int64_t* numels = nullptr;
  int64_t count = 0;
};

// Updates every tensor of `list` in as few launches as the kernel-parameter table allows (chunked multi-tensor
// apply: each CUDA block takes one chunk of one tensor). Asynchronous on `stream`; throws on a launch error.
void launch_adamw_multi_tensor(AdamwStorage storage, const AdamwTensorList& list, const AdamwParams& params,
                               CUstream_st* stream);

// 8-bit AdamW state (Dettmers et al. 2021, "8-bit Optimizers via Block-wise Quantization", as bitsandbytes'
// Adam8bit with blockwise quantization): each moment is stored as one uint8 code per element plus one fp32 absmax
// per block of kAdamwQuantBlock consecutive elements; the value is code_map[code] * absmax. The first moment uses
// the signed dynamic map, the second (never negative) the unsigned one: 256 points each, dense near 0 and spread
// over seven decades, so small moments next to a large one in a block keep ~2 significant digits.
inline constexpr int64_t kAdamwQuantBlock = 256;
inline constexpr int64_t adamw_quant_blocks(int64_t numel) {
  return (numel + kAdamwQuantBlock - 1) / kAdamwQuantBlock;
}
struct AdamwQuantMaps {
  float exp_avg[256];                             // signed dynamic map: sorted, 0 and 1 included, smallest about -0.993
  float exp_avg_sq[256];                          // unsigned dynamic map: sorted, from 0 to 1
  uint8_t exp_avg_zero = 0, exp_avg_sq_zero = 0;  // the codes of 0.0 (the state of a fresh optimizer)
};
// The two maps (built once, in double, rounded to fp32; adamw_quant_map.cpp).
const AdamwQuantMaps& adamw_quant_maps();

// The 8-bit-state update of every tensor of `list` (same math as launch_adamw_multi_tensor, storage of params,
// grads and model copy as `storage` says; the moments 8-bit as above), one pass: each warp owns one block of 256
// elements, dequantizes both moments, updates parameter and moments in fp32, reduces the new absmax of the block,
// and requantizes. Every fp32 operation is the CPU reference's (adamw_int8_math.h): results are bit-identical.
void launch_adamw_int8_multi_tensor(AdamwStorage storage, const AdamwTensorList& list, const AdamwParams& params,
                                    CUstream_st* stream);

// Element type of a gradient list for the fused norm.
enum class NormDtype { kFp32, kBf16 };

// Workspace (fp32 elements) launch_sum_squares_multi_tensor needs for these sizes: one partial per chunk.
int64_t sum_squares_workspace_numel(const int64_t* numels, int64_t count);

// out[0] = sum over all tensors of sum(x^2), accumulated in fp32 (per chunk, then over chunks in a fixed order:
// deterministic, no atomics). Null tensors are skipped. `workspace` holds sum_squares_workspace_numel floats.
// Asynchronous on `stream`; no host sync.
void launch_sum_squares_multi_tensor(NormDtype dtype, const void* const* tensors, const int64_t* numels, int64_t count,
                                     float* workspace, float* out, CUstream_st* stream);

}  // namespace vlatune::kernels
