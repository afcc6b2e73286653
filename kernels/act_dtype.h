// What every fused op's torch-free params header shares: the activation dtype of its raw buffers, and
// cudaStream_t without <cuda_runtime.h> (these headers are included by CPU-only builds too).
//
// Layout shared by the fused ops: activations are contiguous rows of `width` elements in the compute dtype (fp32
// or bf16); every statistic and every product is computed in fp32; results are rounded to the compute dtype once,
// where the unfused ATen sequence rounds (so the bf16 results match the reference's roundings). Design: fused.md.
#pragma once

struct CUstream_st;

namespace vlatune::kernels {

enum class ActDtype { kFp32, kBf16 };

}  // namespace vlatune::kernels
