// The torch tier itself: LibTorch works on the CPU here, and on the H200 through the device ([.gpu]).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>

#include "kernels/device_probe.h"

TEST_CASE("LibTorch computes on the CPU", "[environment]") {
  auto a = torch::arange(6, torch::kFloat32).reshape({2, 3});
  auto b = torch::ones({3, 2});
  auto c = torch::mm(a, b);
  CHECK(c.sizes() == torch::IntArrayRef({2, 2}));
  CHECK(c[0][0].item<float>() == 3.0f);   // 0+1+2
  CHECK(c[1][1].item<float>() == 12.0f);  // 3+4+5
}

TEST_CASE("A bf16 matmul on the GPU matches the fp32 CPU result", "[.gpu][environment]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(0);
  auto a = torch::randn({512, 1024}), b = torch::randn({1024, 256});
  auto ref = torch::mm(a.to(torch::kBFloat16).to(torch::kFloat32), b.to(torch::kBFloat16).to(torch::kFloat32));
  auto got = torch::mm(a.to(torch::kCUDA, torch::kBFloat16), b.to(torch::kCUDA, torch::kBFloat16));
  REQUIRE(got.is_cuda());
  REQUIRE(got.scalar_type() == torch::kBFloat16);
  // bf16 output rounding: relative error ~2^-8 of the norm (METHOD.md bounds by dtype).
  double rel = (got.cpu().to(torch::kFloat32) - ref).norm().item<double>() / ref.norm().item<double>();
  CHECK(rel < 1e-2);
}

TEST_CASE("vlatune's CUDA kernels run the GPU's own machine code, PTX only beyond Hopper", "[.gpu][environment]") {
  REQUIRE(vlatune::kernels::cuda_kernels_built());
  // The default architectures (8.0, 8.6, 8.9, 9.0 + PTX): every GPU up to Hopper has its own SASS; a newer one runs
  // the compute_90 PTX, which reports 900.
  const int cc = vlatune::kernels::device_compute_capability(0);
  INFO("compute capability " << cc << ", built for " << vlatune::kernels::cuda_archs_built());
  CHECK(vlatune::kernels::device_code_arch() == std::min(cc, 90) * 10);
  CHECK(vlatune::kernels::fp8_supported(cc) == (cc >= 89));
}

TEST_CASE("FP8 is available from compute capability 8.9 on, and capabilities print as major.minor", "[environment]") {
  using vlatune::kernels::fp8_supported;
  CHECK_FALSE(fp8_supported(80));
  CHECK_FALSE(fp8_supported(86));
  CHECK(fp8_supported(89));
  CHECK(fp8_supported(90));
  CHECK(fp8_supported(120));
  CHECK_FALSE(fp8_supported(-1));  // no GPU
  CHECK(vlatune::kernels::compute_capability_name(89) == "8.9");
  CHECK(vlatune::kernels::compute_capability_name(-1) == "none");
  // No CUDA device here (or none with this index): -1, never a throw.
  CHECK(vlatune::kernels::device_compute_capability(64) == -1);
}
