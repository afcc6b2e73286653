// FP8: the quantization reference (scales, saturation, e4m3/e5m2 rounding, amax history), the FP8 Linear
// (CPU emulation of the GEMMs) against the bf16/fp32 Linear, the model's FP8 selection and its refusals; on the
// GPU ([.gpu]) the fused quantization kernel byte for byte against the CPU reference, and the FP8 Linear's cuBLASLt
// GEMMs (the heuristic's first choice and timed algorithms) against its CPU emulation.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8.h"
#include "kernels/fp8_ops.h"
#include "kernels/fused_ops.h"
#include "model/float8_linear.h"
#include "model/merged_gemm.h"
#include "model/pi05.h"
#include "tensor_test_util.h"

namespace {

namespace k = vlatune::kernels;
namespace m = vlatune::model;

using vlatune::test::rel_err;

torch::Tensor f32(std::vector<float> v) {
  return torch::tensor(v, torch::kFloat32);
}

// Quantizes x (CPU reference) with the given amax input; returns the FP8 values as floats and the scales.
struct RefQuant {
  torch::Tensor q, q_t, inv_scale, amax_used;
};
RefQuant ref_quant(const torch::Tensor& x, k::Fp8Format f, const torch::Tensor& amax_in, int64_t skip = -1) {
  RefQuant r;
  k::Fp8QuantOutputs o;
  o.out = torch::empty(x.sizes(), torch::TensorOptions().dtype(k::fp8_dtype(f)));
  o.out_t = torch::empty({x.size(1), x.size(0)}, torch::TensorOptions().dtype(k::fp8_dtype(f)));
  o.inv_scale = torch::empty({}, torch::kFloat32);
  o.amax_used = torch::empty({1}, torch::kFloat32);
  k::fp8_quantize_into_ref(x, f, amax_in, skip, o);
  return {o.out.to(torch::kFloat32), o.out_t.to(torch::kFloat32), o.inv_scale, o.amax_used};
}

torch::Tensor first_row_of(const std::vector<float>& values) {  // a [16, 16] tensor whose first row starts with values
  auto x = torch::zeros({16, 16}, torch::kFloat32);
  for (size_t i = 0; i < values.size(); ++i) x[0][static_cast<int64_t>(i)] = values[i];
  return x;
}

}  // namespace

TEST_CASE("FP8 reference quantization: scale, saturation, round-to-nearest-even, transposed copy", "[fp8]") {
  SECTION("scale = fp8_max / amax, inv_scale = 1 / scale") {
    auto x = first_row_of({1.0f, -0.5f, 2.0f});
    auto r = ref_quant(x, k::Fp8Format::kE4m3, f32({2.0f}));
    CHECK(r.inv_scale.item<float>() == 1.0f / (448.0f / 2.0f));
    CHECK(r.amax_used.item<float>() == 2.0f);
    CHECK(r.q[0][0].item<float>() == 224.0f);
    CHECK(r.q[0][1].item<float>() == -112.0f);
    CHECK(r.q[0][2].item<float>() == 448.0f);
    CHECK(torch::equal(r.q_t, r.q.t()));
  }
  SECTION("values beyond the scaled range saturate to +-max (e4m3 448, e5m2 57344)") {
    auto x = first_row_of({3.0f, -3.0f, 1.0f});
    auto r = ref_quant(x, k::Fp8Format::kE4m3, f32({1.0f}));
    CHECK(r.q[0][0].item<float>() == 448.0f);
    CHECK(r.q[0][1].item<float>() == -448.0f);
    CHECK(r.q[0][2].item<float>() == 448.0f);
    auto g = ref_quant(x, k::Fp8Format::kE5m2, f32({1.0f}));
    CHECK(g.q[0][0].item<float>() == 57344.0f);
    CHECK(g.q[0][1].item<float>() == -57344.0f);
  }
  SECTION("ties round to the even mantissa: e4m3 (3 bits) and e5m2 (2 bits)") {
    // amax = fp8_max: scale 1, the values are cast as they are.
    auto e4 = ref_quant(first_row_of({17.0f, 19.0f, 17.5f, 0.5625f}), k::Fp8Format::kE4m3, f32({448.0f}));
    CHECK(e4.q[0][0].item<float>() == 16.0f);  // 16 | 18: even 16
    CHECK(e4.q[0][1].item<float>() == 20.0f);  // 18 | 20: even 20
    CHECK(e4.q[0][2].item<float>() == 18.0f);  // not a tie
    CHECK(e4.q[0][3].item<float>() == 0.5625f);
    auto e5 = ref_quant(first_row_of({18.0f, 22.0f, 0.0f}), k::Fp8Format::kE5m2, f32({57344.0f}));
    CHECK(e5.q[0][0].item<float>() == 16.0f);  // 16 | 20: even 16
    CHECK(e5.q[0][1].item<float>() == 24.0f);  // 20 | 24: even 24
    CHECK(e5.q[0][2].item<float>() == 0.0f);
  }
  SECTION("the history's maximum sets the scale, skipping the slot being written; zero amax = scale 1") {
    auto x = first_row_of({1.0f});
    auto r = ref_quant(x, k::Fp8Format::kE4m3, f32({1.0f, 100.0f, 4.0f}), /*skip=*/1);
    CHECK(r.amax_used.item<float>() == 4.0f);
    CHECK(r.q[0][0].item<float>() == 112.0f);
    auto z = ref_quant(torch::zeros({16, 16}), k::Fp8Format::kE4m3, f32({0.0f}));
    CHECK(z.inv_scale.item<float>() == 1.0f);
  }
  SECTION("amax_out accumulates the maximum of |x|") {
    auto amax = f32({0.5f});
    k::fp8_amax_into(first_row_of({-3.0f, 2.0f}), amax);
    CHECK(amax.item<float>() == 3.0f);
    k::fp8_amax_into(first_row_of({1.0f}), amax);
    CHECK(amax.item<float>() == 3.0f);
  }
}

TEST_CASE("FP8 quantization refuses shapes that are not multiples of 16 and mismatched outputs", "[fp8]") {
  k::Fp8QuantOutputs none;
  CHECK_THROWS_WITH(k::fp8_quantize_into(torch::zeros({16, 24}), k::Fp8Format::kE4m3, f32({1.0f}), -1, none),
                    Catch::Contains("multiples of 16"));
  k::Fp8QuantOutputs wrong;
  wrong.out = torch::empty({16, 16}, torch::TensorOptions().dtype(torch::kFloat8_e5m2));
  CHECK_THROWS_WITH(k::fp8_quantize_into(torch::zeros({16, 16}), k::Fp8Format::kE4m3, f32({1.0f}), -1, wrong),
                    Catch::Contains("out must be"));
  CHECK_THAT(m::float8_shape_problem(24, 32), Catch::Contains("in_features 24"));
  CHECK(m::float8_shape_problem(32, 48).empty());
  m::Float8State st;
  CHECK_THROWS_WITH(m::float8_linear(torch::randn({4, 32}), {torch::randn({40, 32})}, {}, st),
                    Catch::Contains("out_features 40 is not a multiple of 16"));
  CHECK_THROWS_WITH(
      m::float8_linear(torch::randn({4, 32}), {torch::randn({16, 32}), torch::randn({16, 32})}, torch::zeros({16}), st),
      Catch::Contains("for 32 outputs"));
  const auto e4m3 = torch::zeros({16, 16}).to(torch::kFloat8_e4m3fn);
  CHECK_THROWS_WITH(
      k::fp8_mm(e4m3, e4m3.t(), torch::ones({}), torch::ones({}), torch::kFloat, false, torch::zeros({8})),
      Catch::Contains("fp8_mm: bias"));
  // A merged GEMM adds its members' biases only when every member has one.
  m::Linear with_bias(32, 16, true, torch::TensorOptions()), without(32, 16, false, torch::TensorOptions());
  CHECK_THROWS_WITH(m::merged_gemm(torch::randn({4, 32}), {with_bias.get(), without.get()}),
                    Catch::Contains("either every member has a bias or none has"));
  k::MergedRebuild rebuild;
  CHECK_THROWS_WITH(m::merged_gemm(torch::randn({4, 32}), {with_bias.get(), with_bias.get()}, &rebuild),
                    Catch::Contains("no rebuild of a GEMM with biases"));
}

TEST_CASE("fp8_mm's algorithm choice is cuBLASLt's: the CPU emulation computes the same either way", "[fp8]") {
  torch::manual_seed(3);
  const auto a = torch::randn({32, 48}).to(torch::kFloat8_e4m3fn);
  const auto b = torch::randn({16, 48}).to(torch::kFloat8_e4m3fn).t();
  const auto inv_a = torch::full({}, 0.5f), inv_b = torch::full({}, 0.25f), bias = torch::randn({16});
  CHECK(torch::equal(k::fp8_mm(a, b, inv_a, inv_b, torch::kFloat, true, bias, k::Fp8GemmAlgorithm::kTimed),
                     k::fp8_mm(a, b, inv_a, inv_b, torch::kFloat, true, bias)));
}

TEST_CASE("The timed FP8 GEMMs' log line counts the problems off the first choice and the time they save per step",
          "[fp8]") {
  CHECK(k::describe_fp8_timed_gemms({}, 10).empty());
  const float inf = std::numeric_limits<float>::infinity();
  const k::Fp8TimedGemm kept{"kept", {1.0f, 2.0f}, 0, 20};
  const k::Fp8TimedGemm moved{"moved", {1.0f, inf, 0.75f}, 2, 40};  // 0.25 ms x 40 calls over 20 steps
  const k::Fp8TimedGemm none{"none", {}, -1, 5};
  CHECK(k::describe_fp8_timed_gemms({kept, moved, none}, 20) ==
        "fp8.gemm_algorithm timed: 3 FP8 GEMM problems, 1 on another algorithm than cuBLASLt's first choice, about "
        "0.50 ms less per step by their first-call timings");
  CHECK_THAT(k::describe_fp8_timed_gemms({moved}, 0), Catch::Contains("about 10.00 ms"));  // 0 steps: as 1
}

TEST_CASE("The FP8 Linear (CPU emulation) follows the fp32 Linear within FP8 precision, merged and padded", "[fp8]") {
  torch::manual_seed(7);
  for (auto scaling : {m::Fp8Scaling::kCurrent, m::Fp8Scaling::kDelayed}) {
    m::Float8State st;
    st.config.scaling = scaling;
    // 3 x 5 = 15 rows: padded to 16 inside. Two members of 32 and 16 rows (a merged GEMM).
    for (int step = 0; step < 3; ++step) {
      auto x = torch::randn({3, 5, 64}).requires_grad_(true);
      auto w0 = (torch::randn({32, 64}) * 0.1).requires_grad_(true);
      auto w1 = (torch::randn({16, 64}) * 0.1).requires_grad_(true);
      auto seed = torch::randn({3, 5, 48});
      auto y = m::float8_linear(x, {w0, w1}, {}, st);
      REQUIRE(y.sizes() == torch::IntArrayRef({3, 5, 48}));
      (y * seed).sum().backward();
      auto xr = x.detach().clone().requires_grad_(true);
      auto w0r = w0.detach().clone().requires_grad_(true), w1r = w1.detach().clone().requires_grad_(true);
      auto yr = torch::nn::functional::linear(xr, torch::cat({w0r, w1r}, 0));
      (yr * seed).sum().backward();
      CHECK(rel_err(y, yr) < 0.06);
      CHECK(rel_err(x.grad(), xr.grad()) < 0.12);  // e5m2 gradients: 2 mantissa bits
      CHECK(rel_err(w0.grad(), w0r.grad()) < 0.12);
      CHECK(rel_err(w1.grad(), w1r.grad()) < 0.12);
    }
    if (scaling == m::Fp8Scaling::kDelayed) {
      CHECK(st.input.uses == 3);
      CHECK(st.grad_output.uses == 3);
      CHECK(st.input.amax.numel() == 16);
      CHECK(st.input.amax.narrow(0, 0, 3).min().item<float>() > 0.0f);  // three amaxes recorded
    }
  }
}

TEST_CASE("The FP8 merged GEMM adds the members' biases concatenated; each bias gets its columns' gradient", "[fp8]") {
  torch::manual_seed(8);
  m::Float8State st;
  auto x = torch::randn({3, 5, 64});
  auto w0 = torch::randn({32, 64}) * 0.1, w1 = torch::randn({16, 64}) * 0.1;
  auto b0 = torch::randn({32}).requires_grad_(true), b1 = torch::randn({16}).requires_grad_(true);
  auto seed = torch::randn({3, 5, 48});
  auto y = m::float8_linear(x, {w0, w1}, torch::cat({b0, b1}), st);
  (y * seed).sum().backward();
  auto b0r = b0.detach().clone().requires_grad_(true), b1r = b1.detach().clone().requires_grad_(true);
  auto yr = torch::nn::functional::linear(x, torch::cat({w0, w1}, 0), torch::cat({b0r, b1r}));
  (yr * seed).sum().backward();
  CHECK(rel_err(y, yr) < 0.06);
  // The bias gradient is the column sums of the output gradient (fp32 here: exact against ATen's).
  CHECK(torch::allclose(b0.grad(), b0r.grad()));
  CHECK(torch::allclose(b1.grad(), b1r.grad()));
  CHECK(torch::allclose(b1.grad(), seed.reshape({-1, 48}).sum(0).narrow(0, 32, 16)));
}

TEST_CASE("Delayed scaling uses the previous amax: a larger tensor saturates at the old range", "[fp8]") {
  m::Float8State st;
  st.config.scaling = m::Fp8Scaling::kDelayed;
  auto w = torch::eye(16);
  auto x = torch::full({16, 16}, 0.5f);
  m::float8_linear(x, {w}, {}, st);               // first cast: current scaling, records amax 0.5
  auto y = m::float8_linear(x * 4, {w}, {}, st);  // scale from 0.5: 2.0 saturates to 0.5
  CHECK(y.max().item<float>() == Approx(0.5f).epsilon(1e-3));
  auto y3 = m::float8_linear(x * 4, {w}, {}, st);  // the history now holds 2.0
  CHECK(y3.max().item<float>() == Approx(2.0f).epsilon(1e-3));
}

TEST_CASE("The FP8 GeGLU+down projection follows geglu_linear within FP8 precision", "[fp8]") {
  torch::manual_seed(3);
  m::Float8State st;
  auto merged = torch::randn({2, 9, 2 * 64}).requires_grad_(true);
  auto w = (torch::randn({32, 64}) * 0.1).requires_grad_(true);
  auto seed = torch::randn({2, 9, 32});
  auto y = m::float8_geglu_linear(merged, w, st, "");
  (y * seed).sum().backward();
  auto mr = merged.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
  auto yr = k::geglu_linear(mr, wr, {}, "");
  (yr * seed).sum().backward();
  CHECK(rel_err(y, yr) < 0.06);
  CHECK(rel_err(merged.grad(), mr.grad()) < 0.12);
  CHECK(rel_err(w.grad(), wr.grad()) < 0.12);
}

namespace {

// float8_gelu_linear against its composition: gelu, then the FP8 Linear on the GELU output (a leaf). The forward
// GEMM reads the same bytes and the weight gradient's rebuilt input is the forward's cast again, so the output, the
// weight and bias gradients are equal bit for bit; the input gradient differs only by the GELU backward (the
// kernel's against ATen's: equal on the CPU, where both are ATen's). rows: 2 x `tokens` (18: padded to 32).
void check_gelu_linear_composition(torch::Device dev, torch::Dtype dtype, m::Fp8Scaling scaling, int64_t tokens) {
  torch::manual_seed(29);
  m::Float8State node_state, linear_state;
  node_state.config.scaling = linear_state.config.scaling = scaling;
  const auto opt = torch::TensorOptions().device(dev).dtype(dtype);
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step << " tokens " << tokens);
    auto pre = (torch::randn({2, tokens, 128}) * 2).to(opt);
    auto w = (torch::randn({48, 128}) / 8).to(opt), b = torch::randn({48}).to(opt);
    auto seed = torch::randn({2, tokens, 48}).to(opt);
    auto p1 = pre.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true),
         b1 = b.clone().requires_grad_(true);
    auto y1 = m::float8_gelu_linear(p1, w1, b1, node_state, "");
    y1.backward(seed);
    auto act = k::gelu(pre).requires_grad_(true);
    auto w2 = w.clone().requires_grad_(true), b2 = b.clone().requires_grad_(true);
    auto y2 = m::float8_linear(act, {w2}, b2, linear_state);
    y2.backward(seed);
    CHECK(torch::equal(y1, y2));
    CHECK(torch::equal(w1.grad(), w2.grad()));
    CHECK(torch::equal(b1.grad(), b2.grad()));
    const auto grad_pre = at::gelu_backward(act.grad(), pre, "tanh");
    if (dev.is_cpu())
      CHECK(torch::equal(p1.grad(), grad_pre));
    else
      CHECK(rel_err(p1.grad(), grad_pre) < 1e-2);  // the kernel's rounding against ATen's
    // And within FP8 precision of the bf16/fp32 node.
    auto p3 = pre.clone().requires_grad_(true), w3 = w.clone().requires_grad_(true),
         b3 = b.clone().requires_grad_(true);
    auto y3 = k::gelu_linear(p3, w3, b3, "");
    y3.backward(seed);
    CHECK(rel_err(y1, y3) < 0.06);
    CHECK(rel_err(p1.grad(), p3.grad()) < 0.12);  // e5m2 gradients: 2 mantissa bits
    CHECK(rel_err(w1.grad(), w3.grad()) < 0.12);
  }
  if (scaling == m::Fp8Scaling::kDelayed) {
    CHECK(node_state.input.uses == 3);
    CHECK(node_state.grad_output.uses == 3);
  }
}

}  // namespace

TEST_CASE("The FP8 GELU+fc2 node equals the GELU then the FP8 Linear, and follows gelu_linear (CPU)", "[fp8]") {
  for (auto scaling : {m::Fp8Scaling::kCurrent, m::Fp8Scaling::kDelayed})
    for (int64_t tokens : {16, 9}) check_gelu_linear_composition(torch::kCPU, torch::kFloat32, scaling, tokens);
  // A frozen fc2 (no weight or bias gradient): the input gradient alone, the GELU output not rebuilt.
  m::Float8State st;
  auto pre = torch::randn({32, 64}).requires_grad_(true);
  auto w = torch::randn({16, 64}) / 8, b = torch::randn({16});
  m::float8_gelu_linear(pre, w, b, st, "").sum().backward();
  auto pr = pre.detach().clone().requires_grad_(true);
  k::gelu_linear(pr, w, b, "").sum().backward();
  CHECK(rel_err(pre.grad(), pr.grad()) < 0.12);
  CHECK_THROWS_WITH(m::float8_gelu_linear(pre, torch::randn({16, 60}), {}, st, ""),
                    Catch::Contains("must be [out, 64]"));
  CHECK_THROWS_WITH(m::float8_gelu_linear(pre, w, torch::randn({15}), st, ""), Catch::Contains("for 16 outputs"));
}

TEST_CASE("The CUDA FP8 GELU+fc2 node equals the GELU kernel then the FP8 Linear, bit for bit", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  for (auto dtype : {torch::kBFloat16, torch::kFloat32})
    for (auto scaling : {m::Fp8Scaling::kCurrent, m::Fp8Scaling::kDelayed})
      for (int64_t tokens : {256, 9}) check_gelu_linear_composition(torch::kCUDA, dtype, scaling, tokens);
}

TEST_CASE("Pi05Impl::set_fp8 covers merged GEMMs and the vision tower, and refuses what is not a Linear",
          "[fp8][model]") {
  const auto cfg = m::Pi05Config::tiny();
  m::Pi05 net(cfg);
  const std::string lm = "paligemma_with_expert.paligemma.model.language_model.layers.0.";
  net->set_fp8({lm + "self_attn.k_proj", lm + "mlp.up_proj", lm + "mlp.down_proj"});
  CHECK(net->fp8_selection() == std::vector<std::string>{lm + "self_attn.q_proj", lm + "self_attn.k_proj",
                                                         lm + "self_attn.v_proj", lm + "mlp.gate_proj",
                                                         lm + "mlp.up_proj", lm + "mlp.down_proj"});
  CHECK_THROWS_WITH(net->set_fp8({lm + "mlp"}), Catch::Contains("is not a Linear"));
  const std::string vit = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.";
  net->set_fp8({vit + "self_attn.v_proj", vit + "mlp.fc1", vit + "mlp.fc2"});
  CHECK(net->fp8_selection() == std::vector<std::string>{vit + "self_attn.q_proj", vit + "self_attn.k_proj",
                                                         vit + "self_attn.v_proj", vit + "mlp.fc1", vit + "mlp.fc2"});
  net->set_fp8({});
  CHECK(net->fp8_selection().empty());
}

TEST_CASE("The tiny model with FP8 decoder and vision Linears trains close to fp32 (CPU, fused structure)",
          "[fp8][model]") {
  using namespace vlatune::model;
  const auto cfg = Pi05Config::tiny();
  Pi05 net(cfg, torch::kCPU, torch::kFloat32);
  init_weights(*net, 11);
  torch::Generator gen = at::detail::createCPUGenerator(5);
  auto batch = make_random_batch(cfg, 4, 3, 2, 24, 4, 20, 5, &gen, torch::kCPU);
  auto run = [&]() {
    ForwardOptions o;
    o.kernels = Kernels::kFused;
    net->zero_grad(/*set_to_none=*/true);
    auto out = net->forward(batch, o);
    out.loss.backward();
    net->fill_missing_grads();
    const auto& vit0 = net->paligemma_with_expert->paligemma->model->vision_tower->vision_model->encoder->layers[0];
    return std::make_tuple(
        out.loss.detach(),
        net->paligemma_with_expert->paligemma->model->language_model->layers[0]->mlp->gate_proj->weight.grad().clone(),
        torch::cat({vit0->self_attn->k_proj->weight.grad(), vit0->self_attn->v_proj->bias.grad().unsqueeze(1)}, 1));
  };
  auto [ref_loss, ref_grad, ref_vit_grad] = run();
  std::vector<std::string> fqns;
  for (int i = 0; i < 2; ++i) {
    for (const std::string branch : {"paligemma_with_expert.paligemma.model.language_model.layers.",
                                     "paligemma_with_expert.gemma_expert.model.layers."}) {
      for (const std::string leaf : {"self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"})
        fqns.push_back(branch + std::to_string(i) + "." + leaf);
    }
  }
  // SigLIP: the merged q/k/v with its biases, out_proj, fc1 and fc2 (behind the GELU) of layer 0.
  for (const std::string leaf : {"self_attn.q_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"})
    fqns.push_back("paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0." + leaf);
  for (auto scaling : {Fp8Scaling::kCurrent, Fp8Scaling::kDelayed}) {
    Fp8Config c;
    c.scaling = scaling;
    net->set_fp8(fqns, c);
    // 2 layers x 2 branches x (q, k, v, o, gate, up, down), and the vision layer's q, k, v, out_proj, fc1, fc2.
    CHECK(net->fp8_selection().size() == 34);
    for (int step = 0; step < 2; ++step) {
      auto [loss, grad, vit_grad] = run();
      CHECK(rel_err(loss, ref_loss) < 0.02);
      CHECK(rel_err(grad, ref_grad) < 0.25);
      CHECK(rel_err(vit_grad, ref_vit_grad) < 0.25);
    }
  }
  net->set_fp8({});
}

TEST_CASE("The CUDA FP8 quantization kernel equals the CPU reference byte for byte", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(17);
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto format = GENERATE(k::Fp8Format::kE4m3, k::Fp8Format::kE5m2);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 16}, {48, 80}, {1600, 1024}, {528, 2064}}) {
    INFO(rows << " x " << cols << " " << c10::toString(dtype) << " e"
              << (format == k::Fp8Format::kE4m3 ? "4m3" : "5m2"));
    auto x = (torch::randn({rows, cols}) * 3).to(dtype);
    x[0][1] = 1e4f;  // an outlier, and (below) values that saturate under a small history amax
    const auto cuda = torch::TensorOptions().device(torch::kCUDA);
    // amax kernel
    auto amax_gpu = torch::zeros({1}, cuda.dtype(torch::kFloat32));
    k::fp8_amax_into(x.to(torch::kCUDA), amax_gpu);
    auto amax_cpu = torch::zeros({1}, torch::kFloat32);
    k::fp8_amax_into(x, amax_cpu);
    CHECK(amax_gpu.cpu().item<float>() == amax_cpu.item<float>());
    // current scale, and a history whose maximum (skipping slot 1) is below the amax: saturation
    for (auto [hist, skip] : {std::pair<torch::Tensor, int64_t>{amax_cpu, -1}, {f32({2.0f, 1e9f, 5.0f, 0.0f}), 1}}) {
      auto run = [&](const torch::Tensor& xin, const torch::TensorOptions& opt, bool ref) {
        k::Fp8QuantOutputs o;
        o.out = torch::empty({rows, cols}, opt.dtype(k::fp8_dtype(format)));
        o.out_t = torch::empty({cols, rows}, opt.dtype(k::fp8_dtype(format)));
        o.inv_scale = torch::empty({}, opt.dtype(torch::kFloat32));
        o.amax_used = torch::empty({1}, opt.dtype(torch::kFloat32));
        o.amax_out = torch::zeros({1}, opt.dtype(torch::kFloat32));
        auto h = hist.to(opt.device());
        if (ref) {
          k::fp8_quantize_into_ref(xin, format, h, skip, o);
        } else {
          k::fp8_quantize_into(xin, format, h, skip, o);
        }
        return o;
      };
      auto g = run(x.to(torch::kCUDA), cuda, false);
      auto r = run(x, torch::TensorOptions(), true);
      CHECK(torch::equal(g.out.cpu().view(torch::kUInt8), r.out.view(torch::kUInt8)));
      CHECK(torch::equal(g.out_t.cpu().view(torch::kUInt8), r.out_t.view(torch::kUInt8)));
      CHECK(g.inv_scale.cpu().item<float>() == r.inv_scale.item<float>());
      CHECK(g.amax_used.cpu().item<float>() == r.amax_used.item<float>());
      CHECK(g.amax_out.cpu().item<float>() == r.amax_out.item<float>());
    }
  }
}

TEST_CASE("The FP8 Linear's cuBLASLt path matches its CPU emulation (same FP8 operands), both algorithm choices",
          "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(23);
  for (auto [scaling, algorithm] : {std::pair{m::Fp8Scaling::kCurrent, k::Fp8GemmAlgorithm::kHeuristic},
                                    std::pair{m::Fp8Scaling::kDelayed, k::Fp8GemmAlgorithm::kHeuristic},
                                    std::pair{m::Fp8Scaling::kDelayed, k::Fp8GemmAlgorithm::kTimed}}) {
    m::Float8State gpu_state, cpu_state;
    gpu_state.config.scaling = cpu_state.config.scaling = scaling;
    gpu_state.config.gemm_algorithm = algorithm;
    for (int step = 0; step < 3; ++step) {
      // 50 x 6 = 300 rows: padded to 304 (the expert's horizon at a batch that is not a multiple of 8). Step 1 adds
      // the members' biases.
      auto x = torch::randn({6, 50, 256}).to(torch::kBFloat16);
      std::vector<torch::Tensor> ws{(torch::randn({512, 256}) / 16).to(torch::kBFloat16),
                                    (torch::randn({64, 256}) / 16).to(torch::kBFloat16)};
      auto seed = torch::randn({6, 50, 576}).to(torch::kBFloat16);
      auto b = torch::randn({576}).to(torch::kBFloat16);  // in the GEMM's epilogue on the GPU
      auto run = [&](torch::Device dev, m::Float8State& st) {
        auto xl = x.to(dev).requires_grad_(true), bl = b.to(dev).requires_grad_(true);
        std::vector<torch::Tensor> wl;
        for (const auto& w : ws) wl.push_back(w.to(dev).requires_grad_(true));
        auto y = m::float8_linear(xl, wl, step == 1 ? bl : torch::Tensor(), st);
        y.backward(seed.to(dev));
        std::vector<torch::Tensor> out{y.detach().cpu(), xl.grad().cpu(), wl[0].grad().cpu(), wl[1].grad().cpu()};
        if (step == 1) out.push_back(bl.grad().cpu());
        return out;
      };
      auto g = run(torch::kCUDA, gpu_state);
      auto c = run(torch::kCPU, cpu_state);
      for (size_t i = 0; i < g.size(); ++i) {
        INFO("output " << i << " step " << step << " timed " << (algorithm == k::Fp8GemmAlgorithm::kTimed));
        CHECK(rel_err(g[i], c[i]) < 5e-3);  // identical FP8 operands; accumulation order and bf16 output rounding
      }
    }
  }
  // The timed runs chose an algorithm for each problem: the forward with and without the bias epilogue, the input
  // gradient (e4m3 x e5m2) and each member's weight gradient (a row slice of the transposed gradient).
  const std::vector<k::Fp8TimedGemm> timed = k::fp8_timed_gemms();
  REQUIRE(timed.size() >= 4);
  bool bias = false, e5m2 = false, fast = false;
  for (const auto& t : timed) {
    INFO(t.problem);
    CHECK(t.chosen >= 0);
    CHECK(t.calls >= 1);
    CHECK(t.candidate_ms.size() <= static_cast<size_t>(k::kFp8TimedCandidates));
    bias = bias || t.problem.find(" bias") != std::string::npos;
    e5m2 = e5m2 || t.problem.find("e5m2") != std::string::npos;
    fast = fast || t.problem.find("fast-accum") != std::string::npos;
  }
  CHECK(bias);
  CHECK(e5m2);
  CHECK(fast);
  // The GeGLU form on the GPU against its CPU emulation.
  m::Float8State gs, cs;
  auto merged = torch::randn({4, 100, 2 * 256}).to(torch::kBFloat16);
  auto w = (torch::randn({128, 256}) / 16).to(torch::kBFloat16);
  auto seed = torch::randn({4, 100, 128}).to(torch::kBFloat16);
  auto run = [&](torch::Device dev, m::Float8State& st) {
    auto ml = merged.to(dev).requires_grad_(true), wl = w.to(dev).requires_grad_(true);
    auto y = m::float8_geglu_linear(ml, wl, st, "");
    y.backward(seed.to(dev));
    return std::vector<torch::Tensor>{y.detach().cpu(), ml.grad().cpu(), wl.grad().cpu()};
  };
  auto g = run(torch::kCUDA, gs);
  auto c = run(torch::kCPU, cs);
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("geglu output " << i);
    CHECK(rel_err(g[i], c[i]) < 1e-2);
  }
}

namespace {

// The FP8 GeGLU casts' outputs for merged [rows, 2F] (and grad [rows, F]) on `opt`'s device.
struct GegluCast {
  k::Fp8QuantOutputs fwd;
  k::Fp8GegluGradOutputs bwd;
};
GegluCast geglu_cast_outputs(int64_t rows, int64_t f, k::Fp8Format format, const torch::TensorOptions& opt) {
  GegluCast c;
  const auto e4 = opt.dtype(torch::kFloat8_e4m3fn), g8 = opt.dtype(k::fp8_dtype(format)),
             f32o = opt.dtype(torch::kFloat32);
  c.fwd.out = torch::empty({rows, f}, e4);
  c.fwd.out_t = torch::empty({f, rows}, e4);
  c.fwd.inv_scale = torch::empty({}, f32o);
  c.fwd.amax_used = torch::empty({1}, f32o);
  c.fwd.amax_out = torch::zeros({1}, f32o);
  c.bwd.grad_merged.out = torch::empty({rows, 2 * f}, g8);
  c.bwd.grad_merged.out_t = torch::empty({2 * f, rows}, g8);
  c.bwd.grad_merged.inv_scale = torch::empty({}, f32o);
  c.bwd.grad_merged.amax_used = torch::empty({1}, f32o);
  c.bwd.grad_merged.amax_out = torch::zeros({1}, f32o);
  c.bwd.act_t = torch::empty({f, rows}, e4);
  c.bwd.act_inv_scale = torch::empty({}, f32o);
  return c;
}

// The same outputs from the unfused sequence: geglu / geglu_backward, then the plain casts.
GegluCast geglu_cast_unfused(const torch::Tensor& merged, const torch::Tensor& grad, k::Fp8Format format,
                             const torch::Tensor& hist, int64_t skip, const torch::Tensor& act_amax) {
  const int64_t rows = merged.size(0), f = merged.size(1) / 2;
  GegluCast c = geglu_cast_outputs(rows, f, format, merged.options());
  k::fp8_quantize_into(k::geglu(merged), k::Fp8Format::kE4m3, hist, skip, c.fwd);
  k::fp8_quantize_into(k::geglu_backward(grad, merged), format, hist, skip, c.bwd.grad_merged);
  k::Fp8QuantOutputs a;
  a.out_t = c.bwd.act_t;
  a.inv_scale = c.bwd.act_inv_scale;
  k::fp8_quantize_into(k::geglu(merged), k::Fp8Format::kE4m3, act_amax, -1, a);
  return c;
}

GegluCast geglu_cast_fused(const torch::Tensor& merged, const torch::Tensor& grad, k::Fp8Format format,
                           const torch::Tensor& hist, int64_t skip, const torch::Tensor& act_amax) {
  const int64_t rows = merged.size(0), f = merged.size(1) / 2;
  GegluCast c = geglu_cast_outputs(rows, f, format, merged.options());
  k::fp8_geglu_quantize_into(merged, hist, skip, c.fwd);
  k::fp8_geglu_backward_quantize_into(grad, merged, format, hist, skip, act_amax, c.bwd);
  return c;
}

void check_same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  REQUIRE(a.sizes() == b.sizes());
  const auto x = a.cpu().view(torch::kUInt8), y = b.cpu().view(torch::kUInt8);
  const int64_t differ = x.ne(y).sum().item<int64_t>();
  INFO(differ << " of " << x.numel() << " bytes differ");
  CHECK(differ == 0);
}

void check_same(const GegluCast& a, const GegluCast& b) {
  check_same_bytes(a.fwd.out, b.fwd.out);
  check_same_bytes(a.fwd.out_t, b.fwd.out_t);
  check_same_bytes(a.bwd.grad_merged.out, b.bwd.grad_merged.out);
  check_same_bytes(a.bwd.grad_merged.out_t, b.bwd.grad_merged.out_t);
  check_same_bytes(a.bwd.act_t, b.bwd.act_t);
  for (auto [x, y] : {std::pair{a.fwd.inv_scale, b.fwd.inv_scale},
                      {a.fwd.amax_used, b.fwd.amax_used},
                      {a.fwd.amax_out, b.fwd.amax_out},
                      {a.bwd.grad_merged.inv_scale, b.bwd.grad_merged.inv_scale},
                      {a.bwd.grad_merged.amax_used, b.bwd.grad_merged.amax_used},
                      {a.bwd.grad_merged.amax_out, b.bwd.grad_merged.amax_out},
                      {a.bwd.act_inv_scale, b.bwd.act_inv_scale}})
    CHECK(x.cpu().item<float>() == y.cpu().item<float>());
}

}  // namespace

TEST_CASE("The FP8 GeGLU casts equal GeGLU then the plain cast, and refuse bad shapes (CPU)", "[fp8]") {
  torch::manual_seed(3);
  const int64_t rows = 48, f = 32;
  auto merged = torch::randn({rows, 2 * f}), grad = torch::randn({rows, f});
  auto hist = f32({3.0f, 1e9f, 0.5f});
  auto act_amax = f32({2.0f});
  check_same(geglu_cast_fused(merged, grad, k::Fp8Format::kE5m2, hist, 1, act_amax),
             geglu_cast_unfused(merged, grad, k::Fp8Format::kE5m2, hist, 1, act_amax));
  auto amax = torch::zeros({1}), amax_ref = torch::zeros({1});
  k::fp8_geglu_amax_into(merged, amax);
  k::fp8_amax_into(k::geglu(merged), amax_ref);
  CHECK(amax.item<float>() == amax_ref.item<float>());
  amax.zero_();
  amax_ref.zero_();
  k::fp8_geglu_backward_amax_into(grad, merged, amax);
  k::fp8_amax_into(k::geglu_backward(grad, merged), amax_ref);
  CHECK(amax.item<float>() == amax_ref.item<float>());

  auto outs = geglu_cast_outputs(rows, f, k::Fp8Format::kE5m2, torch::TensorOptions());
  CHECK_THROWS_WITH(k::fp8_geglu_quantize_into(torch::randn({rows, 2 * f + 2}), hist, -1, outs.fwd),
                    Catch::Contains("fp8_geglu_quantize") && Catch::Contains("multiples of 16"));
  CHECK_THROWS_WITH(
      k::fp8_geglu_quantize_into(merged, hist, -1,
                                 geglu_cast_outputs(rows, 2 * f, k::Fp8Format::kE5m2, torch::TensorOptions()).fwd),
      Catch::Contains("out must be [rows, cols]"));
  CHECK_THROWS_WITH(k::fp8_geglu_backward_quantize_into(torch::randn({rows, 2 * f}), merged, k::Fp8Format::kE5m2, hist,
                                                        -1, act_amax, outs.bwd),
                    Catch::Contains("grad must be contiguous [rows, F]"));
  CHECK_THROWS_WITH(
      k::fp8_geglu_backward_quantize_into(grad, merged, k::Fp8Format::kE5m2, hist, -1, torch::Tensor(), outs.bwd),
      Catch::Contains("act_amax"));

#ifdef VLATUNE_HAVE_CUDA
  // The raw launchers refuse, before touching memory, more tiles than their tile walk counts in int.
  k::Fp8QuantParams huge;
  huge.rows = int64_t{1} << 32;
  huge.cols = int64_t{1} << 16;
  CHECK_THROWS_WITH(k::launch_fp8_geglu_quantize(huge, nullptr),
                    Catch::Contains("fp8_geglu_quantize") && Catch::Contains("more than 2^30 tiles"));
  k::Fp8GegluBwdParams huge_bwd;
  huge_bwd.grad_merged = huge;
  CHECK_THROWS_WITH(k::launch_fp8_geglu_backward_quantize(huge_bwd, nullptr),
                    Catch::Contains("fp8_geglu_backward_quantize") && Catch::Contains("more than 2^30 tiles"));
#endif
}

TEST_CASE("The CUDA FP8 GeGLU casts equal the geglu kernels then the cast kernel, byte for byte", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(29);
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto format = GENERATE(k::Fp8Format::kE5m2, k::Fp8Format::kE4m3);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{16, 16}, {48, 80}, {1600, 4096}, {528, 2064}}) {
    INFO(rows << " x 2*" << f << " " << c10::toString(dtype));
    auto merged = (torch::randn({rows, 2 * f}, cuda) * 2).to(dtype);
    auto grad = (torch::randn({rows, f}, cuda) * 1e-3).to(dtype);
    merged[0][1] = 300.0f;  // an outlier gate
    for (auto [hist, skip] : {std::pair<torch::Tensor, int64_t>{f32({0.0f}), -1}, {f32({0.05f, 1e9f, 0.02f}), 1}}) {
      auto h = hist.to(torch::kCUDA);
      if (skip < 0) {  // current scaling: the amax of the tensor itself
        k::fp8_amax_into(k::geglu(merged), h);
      }
      auto act_amax = torch::zeros({1}, cuda.dtype(torch::kFloat32));
      k::fp8_geglu_amax_into(merged, act_amax);
      auto act_amax_ref = torch::zeros({1}, cuda.dtype(torch::kFloat32));
      k::fp8_amax_into(k::geglu(merged), act_amax_ref);
      CHECK(act_amax.cpu().item<float>() == act_amax_ref.cpu().item<float>());
      auto g_amax = torch::zeros({1}, cuda.dtype(torch::kFloat32)), g_amax_ref = torch::zeros_like(g_amax);
      k::fp8_geglu_backward_amax_into(grad, merged, g_amax);
      k::fp8_amax_into(k::geglu_backward(grad, merged), g_amax_ref);
      CHECK(g_amax.cpu().item<float>() == g_amax_ref.cpu().item<float>());
      check_same(geglu_cast_fused(merged, grad, format, h, skip, act_amax),
                 geglu_cast_unfused(merged, grad, format, h, skip, act_amax));
    }
  }
}

namespace {

// The GELU cast's outputs (row-major and transposed e4m3, scale, amax used and recorded) for pre [rows, F]: the
// fused entry, or the GELU then the plain cast.
k::Fp8QuantOutputs gelu_cast(const torch::Tensor& pre, const torch::Tensor& hist, int64_t skip, bool fused) {
  const auto opt = pre.options();
  k::Fp8QuantOutputs o;
  o.out = torch::empty({pre.size(0), pre.size(1)}, opt.dtype(torch::kFloat8_e4m3fn));
  o.out_t = torch::empty({pre.size(1), pre.size(0)}, opt.dtype(torch::kFloat8_e4m3fn));
  o.inv_scale = torch::empty({}, opt.dtype(torch::kFloat32));
  o.amax_used = torch::empty({1}, opt.dtype(torch::kFloat32));
  o.amax_out = torch::zeros({1}, opt.dtype(torch::kFloat32));
  if (fused)
    k::fp8_gelu_quantize_into(pre, hist, skip, o);
  else
    k::fp8_quantize_into(k::gelu(pre), k::Fp8Format::kE4m3, hist, skip, o);
  return o;
}

void check_gelu_casts_equal(const torch::Tensor& pre) {
  const auto f32o = pre.options().dtype(torch::kFloat32);
  auto amax = torch::zeros({1}, f32o), amax_ref = torch::zeros({1}, f32o);
  k::fp8_gelu_amax_into(pre, amax);
  k::fp8_amax_into(k::gelu(pre), amax_ref);
  CHECK(amax.cpu().item<float>() == amax_ref.cpu().item<float>());
  for (auto [hist, skip] : {std::pair<torch::Tensor, int64_t>{amax_ref, -1}, {f32({0.5f, 1e9f, 0.2f}), 1}}) {
    const auto h = hist.to(pre.device());
    const auto a = gelu_cast(pre, h, skip, true), b = gelu_cast(pre, h, skip, false);
    check_same_bytes(a.out, b.out);
    check_same_bytes(a.out_t, b.out_t);
    for (auto [x, y] : {std::pair{a.inv_scale, b.inv_scale}, {a.amax_used, b.amax_used}, {a.amax_out, b.amax_out}})
      CHECK(x.cpu().item<float>() == y.cpu().item<float>());
  }
}

}  // namespace

TEST_CASE("The FP8 GELU cast equals the GELU then the plain cast, and refuses bad shapes (CPU)", "[fp8]") {
  torch::manual_seed(31);
  check_gelu_casts_equal(torch::randn({48, 80}) * 3);
  auto amax = torch::zeros({1});
  CHECK_THROWS_WITH(k::fp8_gelu_amax_into(torch::randn({20, 32}), amax), Catch::Contains("multiples of 16"));
  CHECK_THROWS_WITH(k::fp8_gelu_amax_into(torch::randn({32, 64}).t(), amax), Catch::Contains("contiguous"));
}

TEST_CASE("The CUDA FP8 GELU cast equals the GELU kernel then the cast kernel, byte for byte", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(37);
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  // SigLIP's fc1 output at batch 32 (16,384 x 4,304: partial tiles at the right edge), and small shapes.
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{16, 16}, {48, 80}, {528, 2064}, {16384, 4304}}) {
    INFO(rows << " x " << f << " " << c10::toString(dtype));
    auto pre = (torch::randn({rows, f}, torch::TensorOptions().device(torch::kCUDA)) * 3).to(dtype);
    pre[0][1] = 500.0f;  // an outlier
    check_gelu_casts_equal(pre);
  }
}

namespace {

// The GELU backward cast's outputs for pre [rows, F] and grad [rows, F]: the fused entry, or the GELU backward, the
// plain casts and bias_grad.
k::Fp8GeluGradOutputs gelu_backward_cast(const torch::Tensor& grad, const torch::Tensor& pre, k::Fp8Format format,
                                         const torch::Tensor& hist, int64_t skip, const torch::Tensor& act_amax,
                                         bool fused) {
  const auto opt = pre.options();
  const auto f32o = opt.dtype(torch::kFloat32), g8 = opt.dtype(k::fp8_dtype(format));
  const int64_t rows = pre.size(0), f = pre.size(1);
  k::Fp8GeluGradOutputs o;
  o.grad_pre.out = torch::empty({rows, f}, g8);
  o.grad_pre.out_t = torch::empty({f, rows}, g8);
  o.grad_pre.inv_scale = torch::empty({}, f32o);
  o.grad_pre.amax_used = torch::empty({1}, f32o);
  o.grad_pre.amax_out = torch::zeros({1}, f32o);
  o.act_t = torch::empty({f, rows}, opt.dtype(torch::kFloat8_e4m3fn));
  o.act_inv_scale = torch::empty({}, f32o);
  o.bias_grad = torch::empty({f}, opt);
  if (fused) {
    k::fp8_gelu_backward_quantize_into(grad, pre, format, hist, skip, act_amax, o);
    return o;
  }
  auto g = grad.clone();
  const auto grad_pre = k::gelu_backward(g, pre);
  k::fp8_quantize_into(grad_pre, format, hist, skip, o.grad_pre);
  k::Fp8QuantOutputs a;
  a.out_t = o.act_t;
  a.inv_scale = o.act_inv_scale;
  k::fp8_quantize_into(k::gelu(pre), k::Fp8Format::kE4m3, act_amax, -1, a);
  o.bias_grad.copy_(k::bias_grad(grad_pre, pre.scalar_type()));
  return o;
}

// Bytes and scales equal; the bias gradient equal on the CPU (both ATen's sum), within its rounding on the GPU
// (the fused pass sums per 64-row tile, bias_grad per chunk of rows).
void check_gelu_backward_casts_equal(const torch::Tensor& grad, const torch::Tensor& pre, k::Fp8Format format) {
  const auto f32o = pre.options().dtype(torch::kFloat32);
  auto amax = torch::zeros({1}, f32o), amax_ref = torch::zeros({1}, f32o);
  k::fp8_gelu_backward_amax_into(grad, pre, amax);
  auto g = grad.clone();
  k::fp8_amax_into(k::gelu_backward(g, pre), amax_ref);
  CHECK(amax.cpu().item<float>() == amax_ref.cpu().item<float>());
  auto act_amax = torch::zeros({1}, f32o);
  k::fp8_amax_into(k::gelu(pre), act_amax);
  for (auto [hist, skip] : {std::pair<torch::Tensor, int64_t>{amax_ref, -1}, {f32({0.02f, 1e9f, 0.01f}), 1}}) {
    const auto h = hist.to(pre.device());
    const auto a = gelu_backward_cast(grad, pre, format, h, skip, act_amax, true);
    const auto b = gelu_backward_cast(grad, pre, format, h, skip, act_amax, false);
    check_same_bytes(a.grad_pre.out, b.grad_pre.out);
    check_same_bytes(a.grad_pre.out_t, b.grad_pre.out_t);
    check_same_bytes(a.act_t, b.act_t);
    for (auto [x, y] : {std::pair{a.grad_pre.inv_scale, b.grad_pre.inv_scale},
                        {a.grad_pre.amax_used, b.grad_pre.amax_used},
                        {a.grad_pre.amax_out, b.grad_pre.amax_out},
                        {a.act_inv_scale, b.act_inv_scale}})
      CHECK(x.cpu().item<float>() == y.cpu().item<float>());
    if (pre.is_cpu())
      CHECK(torch::equal(a.bias_grad, b.bias_grad));
    else
      CHECK(rel_err(a.bias_grad.cpu().to(torch::kFloat32), b.bias_grad.cpu().to(torch::kFloat32)) <
            (pre.scalar_type() == torch::kFloat32 ? 1e-5 : 4e-3));
  }
}

// fc2(gelu(fc1(x))) with fc1 and fc2 in FP8, fc2's node casting fc1's gradient (`fused`: fc1's state as its
// producer) or not, over three steps of one pair of states: every step's output and gradients (x, w1, b1, w2, b2).
std::vector<std::vector<torch::Tensor>> fp8_mlp_steps(torch::Device dev, torch::Dtype dtype, m::Fp8Scaling scaling,
                                                      bool fused, int64_t& taken) {
  torch::manual_seed(41);
  m::Float8State fc1, fc2;
  fc1.config.scaling = fc2.config.scaling = scaling;
  const auto opt = torch::TensorOptions().device(dev).dtype(dtype);
  std::vector<std::vector<torch::Tensor>> steps;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({2, 64, 48}).to(opt).requires_grad_(true);
    auto w1 = (torch::randn({144, 48}) / 4).to(opt).requires_grad_(true), b1 = torch::randn({144}).to(opt);
    auto w2 = (torch::randn({32, 144}) / 8).to(opt).requires_grad_(true), b2 = torch::randn({32}).to(opt);
    b1.requires_grad_(true);
    b2.requires_grad_(true);
    auto seed = torch::randn({2, 64, 32}).to(opt);
    auto pre = m::float8_linear(x, {w1}, b1, fc1);
    auto y = m::float8_gelu_linear(pre, w2, b2, fc2, "", fused ? &fc1 : nullptr);
    y.backward(seed);
    steps.push_back({y.detach(), x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()});
  }
  taken = fc1.pending_grads_taken;
  CHECK_FALSE(fc1.pending_grad.has_value());
  return steps;
}

void check_fp8_mlp_fusion(torch::Device dev, torch::Dtype dtype, m::Fp8Scaling scaling) {
  int64_t taken_fused = 0, taken_unfused = 0;
  const auto a = fp8_mlp_steps(dev, dtype, scaling, true, taken_fused);
  const auto b = fp8_mlp_steps(dev, dtype, scaling, false, taken_unfused);
  CHECK(taken_fused == 3);
  CHECK(taken_unfused == 0);
  for (size_t step = 0; step < a.size(); ++step)
    for (size_t i = 0; i < a[step].size(); ++i) {
      INFO("step " << step << " tensor " << i << " (y, x, w1, b1, w2, b2)");
      if (i == 3 && !dev.is_cpu())  // fc1's bias gradient: the same values summed in another order
        CHECK(rel_err(a[step][i].cpu().to(torch::kFloat32), b[step][i].cpu().to(torch::kFloat32)) <
              (dtype == torch::kFloat32 ? 1e-5 : 4e-3));
      else
        CHECK(torch::equal(a[step][i], b[step][i]));
    }
}

}  // namespace

TEST_CASE("The FP8 GELU backward cast equals the GELU backward then the plain casts, and refuses bad input (CPU)",
          "[fp8]") {
  torch::manual_seed(43);
  auto pre = torch::randn({48, 80}) * 3, grad = torch::randn({48, 80}) * 1e-2;
  for (auto format : {k::Fp8Format::kE5m2, k::Fp8Format::kE4m3}) check_gelu_backward_casts_equal(grad, pre, format);
  const auto hist = f32({1.0f}), act_amax = f32({2.0f});
  auto o = gelu_backward_cast(grad, pre, k::Fp8Format::kE5m2, hist, -1, act_amax, false);
  CHECK_THROWS_WITH(
      k::fp8_gelu_backward_quantize_into(torch::randn({48, 64}), pre, k::Fp8Format::kE5m2, hist, -1, act_amax, o),
      Catch::Contains("fp8_gelu_backward_quantize") && Catch::Contains("grad must be contiguous"));
  CHECK_THROWS_WITH(k::fp8_gelu_backward_quantize_into(grad, pre, k::Fp8Format::kE5m2, hist, -1, torch::Tensor(), o),
                    Catch::Contains("act_amax"));
  o.bias_grad = torch::empty({64});
  CHECK_THROWS_WITH(k::fp8_gelu_backward_quantize_into(grad, pre, k::Fp8Format::kE5m2, hist, -1, act_amax, o),
                    Catch::Contains("bias_grad must be a contiguous [F] tensor"));
  auto amax = torch::zeros({1});
  CHECK_THROWS_WITH(k::fp8_gelu_backward_amax_into(grad, torch::randn({40, 80}), amax),
                    Catch::Contains("multiples of 16"));
#ifdef VLATUNE_HAVE_CUDA
  // The raw launcher refuses, before touching memory, more tiles than its tile walk counts in int, and a call with
  // nothing to write.
  k::Fp8GeluBwdParams huge;
  huge.grad_pre.rows = int64_t{1} << 32;
  huge.grad_pre.cols = int64_t{1} << 16;
  CHECK_THROWS_WITH(k::launch_fp8_gelu_backward_quantize(huge, nullptr),
                    Catch::Contains("fp8_gelu_backward_quantize") && Catch::Contains("more than 2^30 tiles"));
  k::Fp8GeluBwdParams idle;
  idle.grad_pre.rows = idle.grad_pre.cols = 64;
  idle.grad_pre.x = idle.grad = pre.data_ptr();  // never read: refused first
  CHECK_THROWS_WITH(k::launch_fp8_gelu_backward_quantize(idle, nullptr), Catch::Contains("nothing to write"));
#endif
}

TEST_CASE("fc2's FP8 backward casting fc1's gradient equals fc1 casting it, and fc1 takes it (CPU)", "[fp8]") {
  for (auto scaling : {m::Fp8Scaling::kCurrent, m::Fp8Scaling::kDelayed})
    check_fp8_mlp_fusion(torch::kCPU, torch::kFloat32, scaling);
}

TEST_CASE("The CUDA FP8 GELU backward cast equals the GELU backward kernel then the cast kernel", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(47);
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  // SigLIP's fc1 output at batch 32 (16,384 x 4,304: partial tiles at the right edge), rows that end mid-tile, and
  // small shapes.
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{16, 16}, {48, 80}, {528, 2064}, {16384, 4304}}) {
    INFO(rows << " x " << f << " " << c10::toString(dtype));
    auto pre = (torch::randn({rows, f}, cuda) * 3).to(dtype);
    auto grad = (torch::randn({rows, f}, cuda) * 1e-2).to(dtype);
    pre[0][1] = 500.0f;  // an outlier
    for (auto format : {k::Fp8Format::kE5m2, k::Fp8Format::kE4m3}) check_gelu_backward_casts_equal(grad, pre, format);
  }
  for (auto scaling : {m::Fp8Scaling::kCurrent, m::Fp8Scaling::kDelayed})
    check_fp8_mlp_fusion(torch::kCUDA, dtype, scaling);
}

TEST_CASE("GeGLU inputs in e4m3 blocks: one scale per 64 elements of a row, read back within e4m3's rounding",
          "[fp8]") {
  const int64_t rows = 16, f = 64;
  auto merged = torch::randn({rows, 2 * f});
  merged.select(1, 0).mul_(1e-3);                 // tiny beside their blocks: subnormal or zero in e4m3
  merged.narrow(1, f, 64).mul_(100);              // the up half's first block: large values
  merged.narrow(1, 64, 64).select(0, 3).zero_();  // row 3's second block: all zero
  merged[5][70] = 1e6;                            // an outlier confined to its block
  const k::GegluBlocks b = k::geglu_blocks_like(merged);
  k::geglu_blocks_quantize_ref(merged, b);
  REQUIRE(b.data.sizes() == torch::IntArrayRef({rows, 2 * f}));
  REQUIRE(b.inv_scale.sizes() == torch::IntArrayRef({2 * f / k::kGegluBlock, rows}));
  const auto blocks = merged.reshape({rows, 2 * f / k::kGegluBlock, k::kGegluBlock});
  const auto amax = blocks.abs().amax(-1);
  const auto q = b.data.to(torch::kFloat32).reshape(blocks.sizes());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 2 * f / k::kGegluBlock; ++j) {
      INFO("row " << r << " block " << j);
      const float a = amax[r][j].item<float>(), inv = b.inv_scale[j][r].item<float>();
      if (a == 0) {
        CHECK(inv == 1.0f);  // an all-zero block keeps scale 1
        CHECK(q[r][j].abs().max().item<float>() == 0.0f);
        continue;
      }
      CHECK(inv == 1.0f / (448.0f / a));                   // the block's own scale, fp32
      CHECK(q[r][j].abs().max().item<float>() == 448.0f);  // its largest element maps to e4m3's largest
    }
  const auto back = k::geglu_blocks_dequantize(b, torch::kFloat32);
  // e4m3 keeps 3 mantissa bits: each value comes back within 2^-4 of itself, relative (normals) or within the
  // block's smallest normal step (subnormals).
  const auto err = (back - merged).abs();
  const auto bound =
      merged.abs() * (1.0 / 16 * (1 + 1e-6)) + amax.repeat_interleave(k::kGegluBlock, 1) * std::ldexp(1.0, -9) / 448;
  CHECK(err.le(bound + 1e-30).all().item<bool>());
  CHECK(back[5][70].item<float>() == Approx(1e6).epsilon(1e-6));  // the block's maximum maps to 448
  CHECK(k::geglu_blocks_dequantize(b, torch::kBFloat16).scalar_type() == torch::kBFloat16);

  CHECK_THROWS_WITH(
      k::geglu_blocks_quantize_ref(torch::randn({rows, 96}), k::geglu_blocks_like(torch::randn({rows, 96}))),
      Catch::Contains("multiple of 64"));
  k::GegluBlocks wrong = k::geglu_blocks_like(merged);
  wrong.inv_scale = torch::empty({rows, 1});
  CHECK_THROWS_WITH(k::geglu_blocks_quantize_ref(merged, wrong), Catch::Contains("blocks.inv_scale must be"));
}

TEST_CASE("The FP8 GeGLU casts with merged in e4m3 blocks equal the casts of the values read back (CPU)", "[fp8]") {
  torch::manual_seed(5);
  const int64_t rows = 32, f = 128;
  auto merged = torch::randn({rows, 2 * f}) * 3, grad = torch::randn({rows, f});
  auto hist = f32({2.0f, 1e9f, 0.5f});
  auto act_amax = f32({2.0f});
  const k::GegluBlocks b = k::geglu_blocks_like(merged);
  GegluCast with = geglu_cast_outputs(rows, f, k::Fp8Format::kE5m2, merged.options());
  k::fp8_geglu_quantize_into(merged, hist, 1, with.fwd, b);
  k::fp8_geglu_backward_quantize_into(grad, torch::Tensor(), k::Fp8Format::kE5m2, hist, 1, act_amax, with.bwd, b);
  const k::GegluBlocks ref = k::geglu_blocks_like(merged);
  k::geglu_blocks_quantize_ref(merged, ref);
  check_same_bytes(b.data, ref.data);
  CHECK(torch::equal(b.inv_scale, ref.inv_scale));
  // The forward cast reads merged itself; the backward the values read back from the blocks.
  const GegluCast fwd = geglu_cast_fused(merged, grad, k::Fp8Format::kE5m2, hist, 1, act_amax);
  check_same_bytes(with.fwd.out, fwd.fwd.out);
  const auto back = k::geglu_blocks_dequantize(b, merged.scalar_type());
  const GegluCast bwd = geglu_cast_fused(back, grad, k::Fp8Format::kE5m2, hist, 1, act_amax);
  check_same_bytes(with.bwd.grad_merged.out, bwd.bwd.grad_merged.out);
  check_same_bytes(with.bwd.grad_merged.out_t, bwd.bwd.grad_merged.out_t);
  check_same_bytes(with.bwd.act_t, bwd.bwd.act_t);
  CHECK_FALSE(torch::equal(back, merged));  // the blocks do round
  auto amax = torch::zeros({1}), amax_ref = torch::zeros({1});
  k::fp8_geglu_backward_amax_into(grad, torch::Tensor(), amax, b);
  k::fp8_amax_into(k::geglu_backward(grad, back), amax_ref);
  CHECK(amax.item<float>() == amax_ref.item<float>());
  CHECK_THROWS_WITH(k::fp8_geglu_backward_amax_into(grad, merged, amax, b), Catch::Contains("not both"));
}

TEST_CASE("The CUDA FP8 GeGLU casts write and read e4m3 blocks as the reference does, byte for byte", "[.gpu][fp8]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(31);
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{16, 64}, {48, 192}, {1600, 4096}, {528, 2048}}) {
    INFO(rows << " x 2*" << f << " " << c10::toString(dtype));
    auto merged = (torch::randn({rows, 2 * f}, cuda) * 2).to(dtype);
    auto grad = (torch::randn({rows, f}, cuda) * 1e-3).to(dtype);
    merged[0][1] = 300.0f;
    merged.narrow(1, 64, 64).select(0, 1).zero_();
    auto hist = f32({0.05f, 1e9f, 0.02f}).to(torch::kCUDA);
    auto act_amax = torch::zeros({1}, cuda.dtype(torch::kFloat32));
    k::fp8_geglu_amax_into(merged, act_amax);
    const k::GegluBlocks b = k::geglu_blocks_like(merged), ref = k::geglu_blocks_like(merged);
    GegluCast with = geglu_cast_outputs(rows, f, k::Fp8Format::kE5m2, merged.options());
    k::fp8_geglu_quantize_into(merged, hist, 1, with.fwd, b);
    k::geglu_blocks_quantize_ref(merged, ref);
    check_same_bytes(b.data, ref.data);
    CHECK(torch::equal(b.inv_scale.cpu(), ref.inv_scale.cpu()));
    k::fp8_geglu_backward_quantize_into(grad, torch::Tensor(), k::Fp8Format::kE5m2, hist, 1, act_amax, with.bwd, b);
    const GegluCast bwd =
        geglu_cast_fused(k::geglu_blocks_dequantize(b, dtype), grad, k::Fp8Format::kE5m2, hist, 1, act_amax);
    check_same_bytes(with.bwd.grad_merged.out, bwd.bwd.grad_merged.out);
    check_same_bytes(with.bwd.grad_merged.out_t, bwd.bwd.grad_merged.out_t);
    check_same_bytes(with.bwd.act_t, bwd.bwd.act_t);
    CHECK(with.bwd.act_inv_scale.cpu().item<float>() == bwd.bwd.act_inv_scale.cpu().item<float>());
  }
}
