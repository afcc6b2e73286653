// The LayerNorm backward of several builds of kernels/layer_norm.cu side by side (a base commit's, the tree's, the
// tree's with other tile constants), on the same inputs: grad_x compared byte for byte against the first build, the
// weight and bias gradients (the partials summed in fp64) within a relative 1e-5, each launch timed with CUDA
// events, alternating builds. Built and run by layer-norm-ab-gpu.sh, which compiles this file once per build with
// LAYER_NORM_AB_API=<name> and -Dvlatune=vlatune_<name> (that build's C entry points) and once as the driver, with
// LAYER_NORM_AB_X="X(<name>) X(<name>) ..." listing the builds, the first the one the others are compared with.
#include "kernels/layer_norm.h"

#define LAYER_NORM_AB_CAT2(a, b) a##b
#define LAYER_NORM_AB_CAT(a, b) LAYER_NORM_AB_CAT2(a, b)

#ifdef LAYER_NORM_AB_API
extern "C" void LAYER_NORM_AB_CAT(LAYER_NORM_AB_API, _bwd)(const void* p) {
  vlatune::kernels::launch_layer_norm_bwd(*static_cast<const vlatune::kernels::LayerNormBwdParams*>(p), nullptr);
}
extern "C" long long LAYER_NORM_AB_CAT(LAYER_NORM_AB_API, _bwd_blocks)(int bf16, long long rows, long long width) {
  return vlatune::kernels::layer_norm_bwd_blocks(
      bf16 ? vlatune::kernels::ActDtype::kBf16 : vlatune::kernels::ActDtype::kFp32, rows, width);
}
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "scripts/dev/harness.cuh"

namespace k = vlatune::kernels;

#ifndef LAYER_NORM_AB_X
#error "LAYER_NORM_AB_X: the builds, e.g. -D'LAYER_NORM_AB_X=X(base) X(tree)'"
#endif

// The builds' entry points, declared and listed by the X-macro.
#define X(name)                              \
  extern "C" void name##_bwd(const void* p); \
  extern "C" long long name##_bwd_blocks(int, long long, long long);
LAYER_NORM_AB_X
#undef X

namespace {

struct Build {
  const char* name;
  void (*bwd)(const void*);
  long long (*blocks)(int, long long, long long);
};
const std::vector<Build> kBuilds = {
#define X(name) {#name, name##_bwd, name##_bwd_blocks},
    LAYER_NORM_AB_X
#undef X
};

using harness::check_cuda;
using harness::device_zeros;
using harness::fill;

template <typename T>
std::vector<T> to_host(const void* d, int64_t count) {
  std::vector<T> h(static_cast<size_t>(count));
  check_cuda(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

int failures = 0;

// One shape: every build launched once and compared with the first, then `rounds` rounds of `iterations` launches
// per build, alternating; the median round's ms per launch.
void run_shape(int64_t rows, int64_t width, bool bf16, bool with_grad_h, int rounds) {
  const int64_t n = rows * width, element = bf16 ? 2 : 4;
  void* h = device_zeros(n * element);
  void* grad_y = device_zeros(n * element);
  void* grad_h = with_grad_h ? device_zeros(n * element) : nullptr;
  void* weight_t = bf16 ? device_zeros(width * element) : nullptr;
  auto* weight = static_cast<float*>(device_zeros(width * 4));
  auto* mean = static_cast<float*>(device_zeros(rows * 4));
  auto* rstd = static_cast<float*>(device_zeros(rows * 4));
  fill(h, n, bf16, 1, 0.f, 4.f);
  fill(grad_y, n, bf16, 2, 0.f, 0.02f);
  if (grad_h) fill(grad_h, n, bf16, 3, 0.f, 0.02f);
  fill(weight, width, false, 4, 1.f, 0.5f);
  if (weight_t) fill(weight_t, width, true, 4, 1.f, 0.5f);
  fill(mean, rows, false, 5, 0.f, 0.1f);
  fill(rstd, rows, false, 6, 1.f, 0.5f);

  struct Side {
    void* grad_x;
    float* partials;
    long long blocks;
    k::LayerNormBwdParams p;
    std::vector<float> ms;
  };
  std::vector<Side> sides;
  for (const Build& b : kBuilds) {
    Side s;
    s.blocks = b.blocks(bf16, rows, width);
    s.grad_x = device_zeros(n * element);
    s.partials = static_cast<float*>(device_zeros(s.blocks * 2 * width * 4));
    s.p.dtype = bf16 ? k::ActDtype::kBf16 : k::ActDtype::kFp32;
    s.p.rows = rows;
    s.p.width = width;
    s.p.grad_y = grad_y;
    s.p.grad_h = grad_h;
    s.p.h = h;
    if (bf16) {
      s.p.weight_t = weight_t;
    } else {
      s.p.weight = weight;
    }
    s.p.mean = mean;
    s.p.rstd = rstd;
    s.p.grad_x = s.grad_x;
    s.p.weight_partials = s.partials;
    sides.push_back(s);
  }
  char shape[96];
  std::snprintf(shape, sizeof shape, "%lld x %lld %s%s", static_cast<long long>(rows), static_cast<long long>(width),
                bf16 ? "bf16" : "fp32", with_grad_h ? ", grad_h" : "");

  using Sums = std::vector<double>;  // [2 * width], the partials summed in fp64
  using Bytes = std::vector<uint8_t>;
  std::vector<Sums> sums;  // per build
  std::vector<Bytes> grad_x;
  for (size_t i = 0; i < sides.size(); ++i) {
    kBuilds[i].bwd(&sides[i].p);
    check_cuda(cudaDeviceSynchronize(), kBuilds[i].name);
    const std::vector<float> partials = to_host<float>(sides[i].partials, sides[i].blocks * 2 * width);
    std::vector<double> sum(2 * width, 0.0);
    for (long long b = 0; b < sides[i].blocks; ++b)
      for (int64_t c = 0; c < 2 * width; ++c) sum[c] += partials[b * 2 * width + c];
    sums.push_back(sum);
    grad_x.push_back(to_host<uint8_t>(sides[i].grad_x, n * element));
  }
  for (size_t i = 1; i < sides.size(); ++i) {
    if (grad_x[i] != grad_x[0]) {
      std::printf("  %s: %s grad_x differs from %s\n", shape, kBuilds[i].name, kBuilds[0].name);
      ++failures;
    }
    double worst = 0.0;
    for (int64_t c = 0; c < 2 * width; ++c) {
      const double scale = std::max(1e-3, std::fabs(sums[0][c]));
      worst = std::max(worst, std::fabs(sums[i][c] - sums[0][c]) / scale);
    }
    if (worst > 1e-5) {
      std::printf("  %s: %s weight/bias gradient differs from %s by %.3g (relative)\n", shape, kBuilds[i].name,
                  kBuilds[0].name, worst);
      ++failures;
    }
  }

  const int iterations = 20;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < sides.size(); ++i) {
      kBuilds[i].bwd(&sides[i].p);
      cudaEventRecord(start);
      for (int it = 0; it < iterations; ++it) kBuilds[i].bwd(&sides[i].p);
      cudaEventRecord(stop);
      check_cuda(cudaEventSynchronize(stop), "timed launches");
      float ms = 0.f;
      cudaEventElapsedTime(&ms, start, stop);
      sides[i].ms.push_back(ms / iterations);
    }
  }
  std::printf("| %s |", shape);
  const auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const float first = median(sides[0].ms);
  for (size_t i = 0; i < sides.size(); ++i) {
    const float m = median(sides[i].ms);
    std::printf(" %.4f (%lld blocks, %.2fx) |", m, sides[i].blocks, first / m);
  }
  std::printf("\n");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (Side& s : sides) {
    cudaFree(s.grad_x);
    cudaFree(s.partials);
  }
  for (void* p :
       {h, grad_y, grad_h, weight_t, static_cast<void*>(weight), static_cast<void*>(mean), static_cast<void*>(rstd)})
    if (p) cudaFree(p);
}

}  // namespace

int main() {
  std::printf("| shape |");
  for (const Build& b : kBuilds) std::printf(" %s: ms per launch (grid, %s / it) |", b.name, kBuilds[0].name);
  std::printf("\n|---|");
  for (size_t i = 0; i < kBuilds.size(); ++i) std::printf("---|");
  std::printf("\n");
  // SigLIP at batch 32 (two images of 256 patches), with and without the residual gradient; a partial last block;
  // the other warp-kernel widths; fp32 (the block kernel at this width).
  run_shape(16384, 1152, true, true, 7);
  run_shape(16384, 1152, true, false, 5);
  run_shape(1000, 1152, true, true, 3);
  run_shape(8192, 512, true, true, 3);
  run_shape(8192, 1024, true, true, 3);
  run_shape(4096, 1152, false, true, 3);
  std::printf(failures == 0 ? "outputs: all equal (grad_x bytes; weight/bias within 1e-5)\n"
                            : "outputs: %d difference(s), above\n",
              failures);
  return failures == 0 ? 0 : 1;
}
#endif
