// The FP8 cast kernels of a base commit beside the tree's (kernels/fp8_quant.cu), on the same inputs: every output
// compared byte for byte, each launch timed with CUDA events. Built and run by fp8-cast-ab-gpu.sh, which compiles
// this file twice: with FP8_CAST_AB_BASE_API (and -Dvlatune=vlatune_base, the base kernels' namespace) it is only
// the base kernels' C entry points; without, the driver.
#include "kernels/fp8.h"

#ifdef FP8_CAST_AB_BASE_API
extern "C" void base_geglu_quantize(const void* p) {
  vlatune::kernels::launch_fp8_geglu_quantize(*static_cast<const vlatune::kernels::Fp8QuantParams*>(p), nullptr);
}
extern "C" void base_geglu_backward_quantize(const void* p) {
  vlatune::kernels::launch_fp8_geglu_backward_quantize(*static_cast<const vlatune::kernels::Fp8GegluBwdParams*>(p),
                                                       nullptr);
}
extern "C" void base_quantize(const void* p) {
  vlatune::kernels::launch_fp8_quantize(*static_cast<const vlatune::kernels::Fp8QuantParams*>(p), nullptr);
}
#endif

#ifndef FP8_CAST_AB_BASE_API
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "scripts/dev/harness.cuh"

namespace k = vlatune::kernels;

extern "C" void base_geglu_quantize(const void* p);
extern "C" void base_geglu_backward_quantize(const void* p);
extern "C" void base_quantize(const void* p);

namespace {

__global__ void count_different(const uint8_t* a, const uint8_t* b, int64_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    c += a[i] != b[i];
  atomicAdd(out, c);
}

using harness::check_cuda;
using harness::device_zeros;
void fill(void* x, int64_t n, bool bf16, uint32_t seed, float amplitude) {
  harness::fill(x, n, bf16, seed, 0.f, amplitude);
}
unsigned long long bytes_different(const void* a, const void* b, int64_t n) {
  auto* d = static_cast<unsigned long long*>(device_zeros(8));
  count_different<<<1024, 256>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), n, d);
  unsigned long long h = 0;
  check_cuda(cudaMemcpy(&h, d, 8, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(d);
  return h;
}
float ms_per_launch(const std::function<void()>& launch, int iterations) {
  launch();
  launch();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < iterations; ++i) launch();
  cudaEventRecord(stop);
  check_cuda(cudaEventSynchronize(stop), "timed launches");
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iterations;
}

int failures = 0;

// One side's outputs (base or tree), all zeroed before the first launch.
struct Outputs {
  void *act, *act_t, *blocks, *grad_merged, *grad_merged_t, *recomputed_act_t;
  float *block_scales, *amax, *inv_scale, *amax_used, *bwd_amax, *bwd_inv_scale, *act_inv_scale;
  Outputs(int64_t rows, int64_t f)
      : act(device_zeros(rows * f)),
        act_t(device_zeros(rows * f)),
        blocks(device_zeros(rows * 2 * f)),
        grad_merged(device_zeros(rows * 2 * f)),
        grad_merged_t(device_zeros(rows * 2 * f)),
        recomputed_act_t(device_zeros(rows * f)),
        block_scales(static_cast<float*>(device_zeros(rows * 2 * f / k::kGegluBlock * 4 + 4))),
        amax(static_cast<float*>(device_zeros(4))),
        inv_scale(static_cast<float*>(device_zeros(4))),
        amax_used(static_cast<float*>(device_zeros(4))),
        bwd_amax(static_cast<float*>(device_zeros(4))),
        bwd_inv_scale(static_cast<float*>(device_zeros(4))),
        act_inv_scale(static_cast<float*>(device_zeros(4))) {}
  ~Outputs() {
    for (void* p : {act, act_t, blocks, grad_merged, grad_merged_t, recomputed_act_t, static_cast<void*>(block_scales),
                    static_cast<void*>(amax), static_cast<void*>(inv_scale), static_cast<void*>(amax_used),
                    static_cast<void*>(bwd_amax), static_cast<void*>(bwd_inv_scale), static_cast<void*>(act_inv_scale)})
      cudaFree(p);
  }
};

void compare(const char* launch, const char* output, const void* base, const void* tree, int64_t bytes) {
  const unsigned long long d = bytes_different(base, tree, bytes);
  if (d == 0) return;
  std::printf("  %s: %s differs in %llu of %lld bytes\n", launch, output, d, static_cast<long long>(bytes));
  ++failures;
}

void row(const char* what, const char* shape, float base_ms, float tree_ms) {
  std::printf("| %s | %s | %.4f | %.4f | %.3fx |\n", what, shape, base_ms, tree_ms, base_ms / tree_ms);
}

// Every cast at merged [rows, 2F] (GeGLU) and x [rows, F] (plain): bytes compared; timed when `timed`.
void run_shape(int64_t rows, int64_t f, bool bf16, bool timed) {
  char shape[96];
  std::snprintf(shape, sizeof shape, "%lld x %lld %s", static_cast<long long>(rows), static_cast<long long>(f),
                bf16 ? "bf16" : "fp32");
  const int64_t element = bf16 ? 2 : 4;
  void* merged = device_zeros(rows * 2 * f * element);
  void* grad = device_zeros(rows * f * element);
  auto* history = static_cast<float*>(device_zeros(16 * 4));
  fill(merged, rows * 2 * f, bf16, 1, 8.f);
  fill(grad, rows * f, bf16, 2, 0.01f);
  // An amax history: the forward skips its slot 3 (delayed scaling's own slot), the others read slots 0-2.
  std::vector<float> amax_history(16, 2.f);
  amax_history[1] = 6.f;
  amax_history[3] = 1e9f;
  check_cuda(cudaMemcpy(history, amax_history.data(), 16 * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  const k::ActDtype dtype = bf16 ? k::ActDtype::kBf16 : k::ActDtype::kFp32;
  Outputs base(rows, f), tree(rows, f);
  const int iterations = rows * f >= (int64_t{1} << 26) ? 10 : 50;

  const bool blocks_fit = f % k::kGegluBlock == 0;
  for (int variant = blocks_fit ? 0 : 1; variant < 3; ++variant) {  // e4m3 blocks; row-major only; + transposed
    const char* what = variant == 0   ? "GeGLU forward, e4m3 blocks"
                       : variant == 1 ? "GeGLU forward"
                                      : "GeGLU forward, transposed";
    const auto params = [&](Outputs& o) {
      k::Fp8QuantParams p;
      p.dtype = dtype;
      p.rows = rows;
      p.cols = f;
      p.x = merged;
      p.amax_in = history;
      p.amax_count = 16;
      p.amax_skip = 3;
      p.out = o.act;
      p.out_ld = f;
      if (variant == 2) {
        p.out_t = o.act_t;
        p.out_t_ld = rows;
      }
      p.amax_out = o.amax;
      p.inv_scale_out = o.inv_scale;
      p.amax_used_out = o.amax_used;
      if (variant == 0) {
        p.blocks_out = o.blocks;
        p.blocks_inv_scale_out = o.block_scales;
      }
      return p;
    };
    const k::Fp8QuantParams pb = params(base), pt = params(tree);
    base_geglu_quantize(&pb);
    k::launch_fp8_geglu_quantize(pt, nullptr);
    check_cuda(cudaDeviceSynchronize(), what);
    compare(what, "act", base.act, tree.act, rows * f);
    if (variant == 2) compare(what, "act^T", base.act_t, tree.act_t, rows * f);
    if (variant == 0) {
      compare(what, "blocks", base.blocks, tree.blocks, rows * 2 * f);
      compare(what, "block scales", base.block_scales, tree.block_scales, rows * 2 * f / k::kGegluBlock * 4);
    }
    compare(what, "amax", base.amax, tree.amax, 4);
    compare(what, "inverse scale", base.inv_scale, tree.inv_scale, 4);
    compare(what, "amax used", base.amax_used, tree.amax_used, 4);
    if (timed)
      row(what, shape, ms_per_launch([&] { base_geglu_quantize(&pb); }, iterations),
          ms_per_launch([&] { k::launch_fp8_geglu_quantize(pt, nullptr); }, iterations));
  }

  for (int from_blocks = blocks_fit ? 1 : 0; from_blocks >= 0; --from_blocks) {
    const char* what = from_blocks ? "GeGLU backward, from e4m3 blocks" : "GeGLU backward";
    const auto params = [&](Outputs& o) {
      k::Fp8GegluBwdParams b;
      k::Fp8QuantParams& g = b.grad_merged;
      g.dtype = dtype;
      g.format = k::Fp8Format::kE5m2;
      g.rows = rows;
      g.cols = f;
      g.x = from_blocks ? nullptr : merged;
      g.amax_in = history;
      g.amax_count = 3;
      g.out = o.grad_merged;
      g.out_ld = 2 * f;
      g.out_t = o.grad_merged_t;
      g.out_t_ld = rows;
      g.amax_out = o.bwd_amax;
      g.inv_scale_out = o.bwd_inv_scale;
      if (from_blocks) {  // both sides read the blocks the base forward wrote
        b.merged_blocks = base.blocks;
        b.merged_blocks_inv_scale = base.block_scales;
      }
      b.grad = grad;
      b.act_amax_in = history;
      b.act_t = o.recomputed_act_t;
      b.act_t_ld = rows;
      b.act_inv_scale_out = o.act_inv_scale;
      return b;
    };
    const k::Fp8GegluBwdParams pb = params(base), pt = params(tree);
    base_geglu_backward_quantize(&pb);
    k::launch_fp8_geglu_backward_quantize(pt, nullptr);
    check_cuda(cudaDeviceSynchronize(), what);
    compare(what, "d merged", base.grad_merged, tree.grad_merged, rows * 2 * f);
    compare(what, "d merged^T", base.grad_merged_t, tree.grad_merged_t, rows * 2 * f);
    compare(what, "act^T", base.recomputed_act_t, tree.recomputed_act_t, rows * f);
    compare(what, "amax", base.bwd_amax, tree.bwd_amax, 4);
    compare(what, "inverse scales", base.bwd_inv_scale, tree.bwd_inv_scale, 4);
    compare(what, "act inverse scale", base.act_inv_scale, tree.act_inv_scale, 4);
    if (timed)
      row(what, shape, ms_per_launch([&] { base_geglu_backward_quantize(&pb); }, iterations),
          ms_per_launch([&] { k::launch_fp8_geglu_backward_quantize(pt, nullptr); }, iterations));
  }

  for (const k::Fp8Format format : {k::Fp8Format::kE4m3, k::Fp8Format::kE5m2}) {
    const char* what = format == k::Fp8Format::kE4m3 ? "plain cast e4m3, transposed" : "plain cast e5m2, transposed";
    const auto params = [&](Outputs& o) {
      k::Fp8QuantParams p;
      p.dtype = dtype;
      p.format = format;
      p.rows = rows;
      p.cols = f;
      p.x = grad;
      p.amax_in = history;
      p.amax_count = 3;
      p.out = o.act;
      p.out_ld = f;
      p.out_t = o.act_t;
      p.out_t_ld = rows;
      p.amax_out = o.amax;
      p.inv_scale_out = o.inv_scale;
      return p;
    };
    const k::Fp8QuantParams pb = params(base), pt = params(tree);
    base_quantize(&pb);
    k::launch_fp8_quantize(pt, nullptr);
    check_cuda(cudaDeviceSynchronize(), what);
    compare(what, "out", base.act, tree.act, rows * f);
    compare(what, "out^T", base.act_t, tree.act_t, rows * f);
    compare(what, "amax", base.amax, tree.amax, 4);
    compare(what, "inverse scale", base.inv_scale, tree.inv_scale, 4);
    if (timed)
      row(what, shape, ms_per_launch([&] { base_quantize(&pb); }, iterations),
          ms_per_launch([&] { k::launch_fp8_quantize(pt, nullptr); }, iterations));
  }
  for (void* p : {merged, grad, static_cast<void*>(history)}) cudaFree(p);
}

}  // namespace

int main() {
  std::printf("| launch | rows x F | base ms | tree ms | base / tree |\n|---|---|---|---|---|\n");
  // Partial tiles (rows or F not multiples of 64) and fp32: bytes only.
  run_shape(1040, 192, true, false);
  run_shape(1040, 2064, true, false);
  run_shape(1040, 128, false, false);
  // The backbone MLP at batch 32 and the attention width; an fp32 shape.
  run_shape(22784, 16384, true, true);
  run_shape(22784, 2048, true, true);
  run_shape(4096, 4096, false, true);
  std::printf("%s\n", failures == 0 ? "bytes: all equal" : "bytes: DIFFERENT (above)");
  return failures == 0 ? 0 : 1;
}
#endif
