// Pi0.5 on the GPU ([.gpu]: run on the H200 through scripts/gpu-check.sh).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "model/pi05.h"

namespace {

using namespace vlatune::model;

double rel_err(const torch::Tensor& got, const torch::Tensor& ref) {
  auto g = got.detach().to(torch::kCPU, torch::kFloat64), r = ref.detach().to(torch::kCPU, torch::kFloat64);
  return (g - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
}

}  // namespace

TEST_CASE("The tiny model gives the same loss and gradients on the GPU as on the CPU (fp32)", "[.gpu][model]") {
  REQUIRE(torch::cuda::is_available());
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const auto cfg = Pi05Config::tiny();
  Pi05 cpu(cfg, torch::kCPU, torch::kFloat32), gpu(cfg, torch::kCUDA, torch::kFloat32);
  init_weights(*cpu, 7);  // init draws from the parameters' device generator: copy, do not re-draw on the GPU
  {
    torch::NoGradGuard no_grad;
    auto src = cpu->named_parameters();
    for (auto& item : gpu->named_parameters()) item.value().copy_(src[item.key()]);
  }
  torch::Generator gen = at::detail::createCPUGenerator(3);
  auto batch = make_random_batch(cfg, 4, 3, 2, 24, 3, 20, 10, &gen, torch::kCPU);
  Pi05Batch batch_gpu = batch;
  for (torch::Tensor* t : {&batch_gpu.images, &batch_gpu.image_masks, &batch_gpu.tokens, &batch_gpu.token_masks,
                           &batch_gpu.actions, &batch_gpu.noise, &batch_gpu.time})
    *t = t->to(torch::kCUDA);
  auto out_cpu = cpu->forward(batch), out_gpu = gpu->forward(batch_gpu);
  out_cpu.loss.backward();
  out_gpu.loss.backward();
  cpu->fill_missing_grads();
  gpu->fill_missing_grads();
  CHECK(rel_err(out_gpu.loss, out_cpu.loss) < 1e-5);
  CHECK(rel_err(out_gpu.velocity, out_cpu.velocity) < 1e-5);
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  for (const auto& item : pc) {
    INFO(item.key());
    const std::string& name = item.key();
    const std::string suffix = "self_attn.k_proj.bias";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      // A key bias adds the same logit to every key of a query row: softmax ignores it, so its exact gradient is
      // zero and both devices hold rounding noise. Check that it is noise next to the key weight's gradient.
      const auto weight = name.substr(0, name.size() - 4) + "weight";
      const double scale = pc[weight].grad().norm().item<double>();
      CHECK(pg[name].grad().norm().item<double>() < 1e-4 * scale);
      CHECK(item.value().grad().norm().item<double>() < 1e-4 * scale);
      continue;
    }
    CHECK(rel_err(pg[name].grad(), item.value().grad()) < 1e-4);
  }
}

TEST_CASE("Full-size Pi0.5 trains a bf16 step on the GPU with finite loss and gradients", "[.gpu][model]") {
  REQUIRE(torch::cuda::is_available());
  const auto cfg = Pi05Config::full();
  Pi05 net(cfg, torch::kCUDA, torch::kBFloat16);
  init_weights(*net, 0);
  torch::Generator gen = at::detail::createCPUGenerator(1);
  auto batch = make_random_batch(cfg, 4, 3, 2, 200, 20, 199, 50, &gen, torch::kCUDA);

  ForwardOptions lean, materialized;
  materialized.attention = Attention::kMaterialized;
  auto out = net->forward(batch, lean);
  REQUIRE(std::isfinite(out.loss.item<double>()));
  out.loss.backward();
  net->fill_missing_grads();
  for (const auto& item : net->named_parameters()) {
    INFO(item.key());
    REQUIRE(item.value().grad().defined());
    REQUIRE(torch::isfinite(item.value().grad()).all().item<bool>());
  }
  // The lean (SDPA) and materialized attention paths agree within bf16 rounding on the full model.
  torch::NoGradGuard no_grad;
  auto ref = net->forward(batch, materialized);
  CHECK(rel_err(out.velocity, ref.velocity) < 2e-2);
}
