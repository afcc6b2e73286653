// The multi-tensor machinery the AdamW kernels share (adamw.cu: full-precision state and the norm; adamw_int8.cu:
// 8-bit state): the work split and its measured constants, the launch scalars, vector packs, the host loop that
// fills a launch's (tensor, chunk) table, and the checks and storage dispatch of both entry points. Torch-free;
// included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/adamw.h"
#include "kernels/fused_device.cuh"

namespace vlatune::kernels::adamw_detail {

// Work split. A block owns one chunk of one tensor; the (tensor, chunk) table of a launch travels in the kernel
// parameters (no host->device copy, no sync), which CUDA >= 12.1 allows up to 32,764 bytes on sm_70+.
// Choices measured on the H200 (standalone smoke test: 8.4e8 bf16 elements in 986 tensors, the bf16 update; a
// device-to-device copy of the same 14 B/element moves 4.27 TB/s):
// - kChunk: 64 Ki elements keeps a block busy for 32 iterations at 512 threads; a 1024-element bias is still a
//   single (short) block.
// - kBlock 512, kVec 4: 2.61 TB/s; 256 threads 2.42; kVec 8 (16 B bf16 accesses, 46 registers: 2 blocks/SM) 2.47
//   at 512 threads, 2.48 at 256, 2.25 at 128.
// - kMaxTensors/kMaxBlocks 192/3072 (24 KB of parameters): 2.78 TB/s, against 2.61 with 96/1536 — fewer launches,
//   so fewer partial last waves (3,072 blocks ~ 7.8 waves of 3 resident 512-thread blocks on 132 SMs).
// - The norm kernel reads 8 elements (16 B of bf16) per access: 3.4-3.6 TB/s against 3.0 with 4.
constexpr int kChunk = 65536;
constexpr int kBlock = 512;
constexpr int kVec = 4;      // elements per thread and iteration in the AdamW kernel: 16 B fp32, 8 B bf16 accesses
constexpr int kNormVec = 8;  // ... in the norm kernel
constexpr int kMaxTensors = 192;
constexpr int kMaxBlocks = 3072;
constexpr int kFinalizeBlock = 1024;
static_assert(kChunk % kVec == 0 && kChunk % kNormVec == 0, "chunk starts must keep vector alignment");
static_assert(kMaxTensors <= 256, "block_tensor is uint8");

struct AdamwScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps;
  float decay;       // 1 - lr * weight_decay
  float step_size;   // lr / (1 - beta1^step)
  float bc2_sqrt;    // sqrt(1 - beta2^step)
  float grad_scale;  // host factor
  const float* grad_scale_device;
  const float* step_scalars_device;  // non-null: {decay, step_size, bc2_sqrt} read here (AdamwParams)
};

// The launch scalars of `params` (bias corrections in double on the host, rounded once: adamw_step_scalars).
inline AdamwScalars make_adamw_scalars(const AdamwParams& params) {
  const AdamwStepScalars step = adamw_step_scalars(params);
  AdamwScalars s;
  s.beta1 = static_cast<float>(params.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - params.beta1);
  s.beta2 = static_cast<float>(params.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - params.beta2);
  s.eps = static_cast<float>(params.eps);
  s.decay = step.decay;
  s.step_size = step.step_size;
  s.bc2_sqrt = step.bc2_sqrt;
  s.grad_scale = static_cast<float>(params.grad_scale);
  s.grad_scale_device = params.grad_scale_device;
  s.step_scalars_device = params.step_scalars_device;
  return s;
}

// The scalars a block uses (the device schedule when there is one) and the gradient factor (host factor times the
// device clip coefficient). False when the device coefficient is not finite: the block writes nothing.
__device__ __forceinline__ bool resolve_scalars(const AdamwScalars& in, AdamwScalars& s, float& grad_scale) {
  s = in;
  if (s.step_scalars_device != nullptr) {
    s.decay = s.step_scalars_device[0];
    s.step_size = s.step_scalars_device[1];
    s.bc2_sqrt = s.step_scalars_device[2];
  }
  grad_scale = s.grad_scale;
  if (s.grad_scale_device != nullptr) {
    const float d = *s.grad_scale_device;
    if (!isfinite(d)) return false;
    grad_scale *= d;
  }
  return true;
}

// N elements moved as one (or, for 32 B, two) vector accesses.
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ bool vec_aligned(const T* ptr) {
  return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % alignof(Pack<T, N>) == 0;
}

inline int64_t chunks_of(int64_t numel) {
  return (numel + kChunk - 1) / kChunk;
}

inline void check_list(const char* what, int64_t count, const int64_t* numels) {
  if (count < 0) throw std::invalid_argument(std::string(what) + ": negative tensor count");
  if (count > 0 && numels == nullptr) throw std::invalid_argument(std::string(what) + ": numels is null");
  for (int64_t i = 0; i < count; ++i) {
    if (numels[i] < 0) {
      throw std::invalid_argument(std::string(what) + ": numels[" + std::to_string(i) + "] is negative");
    }
  }
}

// Chunked multi-tensor apply: fills `table` with tensors and (tensor, chunk) block entries, and calls
// launch(blocks) each time the block table or the tensor table is full, then once for the rest. `set_slot(slot,
// i)` copies tensor i's pointers into table slot `slot` (false: tensor i is skipped); a tensor that continues into
// the next launch is set again into slot 0.
template <typename Table, typename SetSlot, typename Launch>
void for_each_launch(Table& table, const int64_t* numels, int64_t count, SetSlot set_slot, Launch launch) {
  int tensors = 0, blocks = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (numels[i] == 0 || !set_slot(tensors, i)) continue;
    table.n[tensors] = numels[i];
    ++tensors;
    const int64_t chunks = chunks_of(numels[i]);
    for (int64_t c = 0; c < chunks; ++c) {
      table.block_tensor[blocks] = static_cast<uint8_t>(tensors - 1);
      table.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks == kMaxBlocks || (tensors == kMaxTensors && last_chunk)) {
        launch(blocks);
        blocks = 0;
        if (last_chunk) {
          tensors = 0;
        } else {
          set_slot(0, i);
          table.n[0] = numels[i];
          tensors = 1;
        }
      }
    }
  }
  if (blocks > 0) launch(blocks);
}

// The element types of each storage (adamw.h AdamwTensorList): parameters (the fp32 master in kFp32Master),
// gradients, full-precision moments, and whether a bf16 model copy is written.
template <typename P, typename G, typename S, bool kWritesModel>
struct ElementTypes {
  using Param = P;
  using Grad = G;
  using State = S;
  static constexpr bool kModel = kWritesModel;
};
template <AdamwStorage kStorage>
struct StorageTypes;
template <>
struct StorageTypes<AdamwStorage::kFp32> : ElementTypes<float, float, float, false> {};
template <>
struct StorageTypes<AdamwStorage::kBf16> : ElementTypes<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, false> {};
template <>
struct StorageTypes<AdamwStorage::kFp32Master> : ElementTypes<float, __nv_bfloat16, float, true> {};

// The body of both entry points of adamw.h: checks `list` (with 8-bit state also its absmax arrays) and the step,
// rounds the launch scalars, and calls launch_typed(std::integral_constant<AdamwStorage, kStorage>{}, scalars) for
// `storage` inside the NVTX range "<nvtx>[<storage>]". `what` names the entry point in errors.
template <typename LaunchTyped>
void launch_update(const char* what, const char* nvtx, AdamwStorage storage, const AdamwTensorList& list,
                   const AdamwParams& params, bool int8_state, LaunchTyped launch_typed) {
  check_list(what, list.count, list.numels);
  if (list.count == 0) return;
  if (list.params == nullptr || list.grads == nullptr || list.exp_avg == nullptr || list.exp_avg_sq == nullptr ||
      (int8_state && (list.exp_avg_absmax == nullptr || list.exp_avg_sq_absmax == nullptr)) ||
      (storage == AdamwStorage::kFp32Master && list.model_bf16 == nullptr)) {
    throw std::invalid_argument(std::string(what) + "[" + adamw_storage_name(storage) + "]: a pointer array is null");
  }
  if (params.step < 1) {
    throw std::invalid_argument(std::string(what) + ": step must be >= 1 (1-based), got " +
                                std::to_string(params.step));
  }
  const AdamwScalars scalars = make_adamw_scalars(params);
  const fused_detail::NvtxRange range((std::string(nvtx) + "[" + adamw_storage_name(storage) + "]").c_str());
  switch (storage) {
    case AdamwStorage::kFp32:
      launch_typed(std::integral_constant<AdamwStorage, AdamwStorage::kFp32>{}, scalars);
      break;
    case AdamwStorage::kBf16:
      launch_typed(std::integral_constant<AdamwStorage, AdamwStorage::kBf16>{}, scalars);
      break;
    case AdamwStorage::kFp32Master:
      launch_typed(std::integral_constant<AdamwStorage, AdamwStorage::kFp32Master>{}, scalars);
      break;
  }
}

}  // namespace vlatune::kernels::adamw_detail
