// kernels/ fused ops: the `_ref` functions against the formulas written out element by element (CPU, fp64), the
// autograd wrappers against autograd of their `_ref` (CPU, fp64: the wrappers' analytic backwards), the model's
// fused structure against the reference modules (CPU, fp64, tiny config), and the CUDA kernels against an fp64
// reference on fresh random inputs ([.gpu]).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/column_sums.h"
#include "kernels/fused_ops.h"
#include "model/pi05.h"
#include "tensor_test_util.h"

namespace {

namespace k = vlatune::kernels;

using vlatune::test::rel_err;

bool all_finite(const torch::Tensor& t) {
  return torch::isfinite(t.detach().to(torch::kFloat32)).all().item<bool>();
}

// Leaves (requires_grad) for a list of tensors, in place of the originals; undefined stays undefined.
std::vector<torch::Tensor> leaves(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.detach().clone().requires_grad_(true) : t);
  return out;
}

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.grad() : torch::Tensor());
  return out;
}

// Runs `fn` on leaves made from `inputs`, back-propagates `seeds` (one per output; sum of <out, seed>) and
// returns {outputs, input gradients}.
template <typename Fn>
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> run_with_grads(
    Fn&& fn, const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& seeds) {
  auto in = leaves(inputs);
  std::vector<torch::Tensor> outs = fn(in);
  torch::Tensor total;
  for (size_t i = 0; i < outs.size(); ++i) {
    auto term = (outs[i].to(torch::kFloat64) * seeds[i].to(outs[i].device(), torch::kFloat64)).sum();
    total = total.defined() ? total + term : term;
  }
  total.backward();
  std::vector<torch::Tensor> detached;
  for (const auto& o : outs) detached.push_back(o.detach());
  return {detached, grads_of(in)};
}

void check_all(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& ref, double tol,
               const char* what) {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << " " << i);
    REQUIRE(got[i].defined() == ref[i].defined());
    if (!got[i].defined()) continue;
    CHECK(got[i].sizes() == ref[i].sizes());
    CHECK(all_finite(got[i]));
    CHECK(rel_err(got[i], ref[i]) < tol);
  }
}

torch::Tensor randn(std::vector<int64_t> shape, torch::Dtype dtype = torch::kFloat64) {
  return torch::randn(shape, torch::TensorOptions().dtype(torch::kFloat64)).to(dtype);
}

// The four ops as functions of a flat input list (undefined entries: absent optional inputs).
std::vector<torch::Tensor> rms_fused(const std::vector<torch::Tensor>& in) {
  auto o = k::rms_norm_residual(in[0], in[1], in[2], 1e-6);
  return {o.h, o.y};
}
std::vector<torch::Tensor> rms_ref(const std::vector<torch::Tensor>& in) {
  auto o = k::rms_norm_residual_ref(in[0], in[1], in[2], 1e-6);
  return {o.h, o.y};
}
std::vector<torch::Tensor> ada_fused(const std::vector<torch::Tensor>& in) {
  auto o = k::adarms_norm_residual(in[0], in[1], in[2], in[3], in[4], 1e-6);
  return {o.h, o.y};
}
std::vector<torch::Tensor> ada_ref(const std::vector<torch::Tensor>& in) {
  auto o = k::adarms_norm_residual_ref(in[0], in[1], in[2], in[3], in[4], 1e-6);
  return {o.h, o.y};
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t b, int64_t n, int64_t d, torch::Dtype dtype) {
  auto pos = torch::arange(n, torch::TensorOptions().dtype(torch::kFloat64)).unsqueeze(0).repeat({b, 1});
  pos = pos + torch::randint(0, 3, {b, 1}, torch::TensorOptions().dtype(torch::kFloat64));
  auto inv =
      torch::pow(10000.0, torch::arange(d / 2, torch::TensorOptions().dtype(torch::kFloat64)) * (2.0 / d)).reciprocal();
  auto ang = (pos.unsqueeze(-1) * inv).unsqueeze(1);
  return {ang.cos().to(dtype), ang.sin().to(dtype)};
}

// ---- The formulas element by element (spec §3, §4.3; SigLIP's LayerNorm), in double: the oracles of the `_ref`
// functions, written without the ATen ops those use.

// [rows, width] views of a [..., width] tensor in fp64, as nested vectors.
std::vector<std::vector<double>> rows_of(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kFloat64).contiguous().reshape({-1, t.size(-1)});
  const auto a = c.accessor<double, 2>();
  std::vector<std::vector<double>> out(static_cast<size_t>(c.size(0)), std::vector<double>(c.size(1)));
  for (int64_t r = 0; r < c.size(0); ++r)
    for (int64_t i = 0; i < c.size(1); ++i) out[r][i] = a[r][i];
  return out;
}

torch::Tensor from_rows(const std::vector<std::vector<double>>& rows, at::IntArrayRef shape) {
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return torch::tensor(flat, torch::kFloat64).reshape(shape);
}

// y = h / sqrt(mean(h^2) + eps) * (1 + w) + b per row; h = x + g * d (g, d, w, b broadcast per batch row of `tokens`).
torch::Tensor rms_loops(const torch::Tensor& h_in, const torch::Tensor& scale, const torch::Tensor& shift,
                        int64_t tokens, double eps) {
  auto h = rows_of(h_in), sc = rows_of(scale), sh = shift.defined() ? rows_of(shift) : sc;
  for (size_t r = 0; r < h.size(); ++r) {
    const auto& s = sc[scale.numel() == h_in.size(-1) ? 0 : r / static_cast<size_t>(tokens)];
    const auto& t = sh[scale.numel() == h_in.size(-1) ? 0 : r / static_cast<size_t>(tokens)];
    double ss = 0;
    for (double v : h[r]) ss += v * v;
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(h[r].size()) + eps);
    for (size_t i = 0; i < h[r].size(); ++i) h[r][i] = h[r][i] * rstd * (1.0 + s[i]) + (shift.defined() ? t[i] : 0.0);
  }
  return from_rows(h, h_in.sizes());
}

torch::Tensor layer_norm_loops(const torch::Tensor& h_in, const torch::Tensor& w, const torch::Tensor& b, double eps) {
  auto h = rows_of(h_in);
  const auto wv = rows_of(w)[0], bv = rows_of(b)[0];
  for (auto& row : h) {
    double mean = 0, var = 0;
    for (double v : row) mean += v;
    mean /= static_cast<double>(row.size());
    for (double v : row) var += (v - mean) * (v - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(row.size()) + eps);
    for (size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) * rstd * wv[i] + bv[i];
  }
  return from_rows(h, h_in.sizes());
}

// The heads [first, first + count) of positions [0, t) of a [B, t, (...) * d] output as [B, count, t, d], rotated:
// [u cos - v sin | v cos + u sin] at position offset + n (cos, sin [B, 1, N, d / 2]); `rotate` false: copied.
torch::Tensor heads_loops(const torch::Tensor& y, int64_t first, int64_t count, int64_t d, int64_t offset,
                          const torch::Tensor& cos, const torch::Tensor& sin, bool rotate) {
  const auto ya = y.accessor<double, 3>();
  const auto ca = cos.accessor<double, 4>(), sa = sin.accessor<double, 4>();
  auto out = torch::zeros({y.size(0), count, y.size(1), d}, torch::kFloat64);
  auto oa = out.accessor<double, 4>();
  const int64_t half = d / 2;
  for (int64_t b = 0; b < y.size(0); ++b)
    for (int64_t h = 0; h < count; ++h)
      for (int64_t n = 0; n < y.size(1); ++n)
        for (int64_t i = 0; i < half; ++i) {
          const double u = ya[b][n][(first + h) * d + i], v = ya[b][n][(first + h) * d + half + i];
          const double c = rotate ? ca[b][0][offset + n][i] : 1.0, s = rotate ? sa[b][0][offset + n][i] : 0.0;
          oa[b][h][n][i] = u * c - v * s;
          oa[b][h][n][half + i] = v * c + u * s;
        }
  return out;
}

// GELU (tanh approximation) written out: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in fp64 ATen
// elementwise ops (autograd gives its derivative without at::gelu_backward).
torch::Tensor gelu_tanh_formula(const torch::Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + torch::tanh(c * (x + 0.044715 * x * x * x)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------- CPU

TEST_CASE("The fused RMSNorm wrapper matches autograd of its reference, with and without the residual",
          "[fused][kernels]") {
  torch::manual_seed(1);
  const bool residual = GENERATE(true, false);
  INFO("residual " << residual);
  std::vector<torch::Tensor> in = {randn({3, 5, 32}), residual ? randn({3, 5, 32}) : torch::Tensor(),
                                   randn({32}) * 0.1};
  std::vector<torch::Tensor> seeds = {randn({3, 5, 32}), randn({3, 5, 32})};
  auto [out_f, grad_f] = run_with_grads(rms_fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(rms_ref, in, seeds);
  const torch::Tensor h = residual ? in[0] + in[1] : in[0];
  CHECK(rel_err(out_r[0], h) < 1e-15);
  CHECK(rel_err(out_r[1], rms_loops(h, in[2], torch::Tensor(), 5, 1e-6)) < 1e-14);
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("The fused adaRMS wrapper matches autograd of its reference, with and without the gated residual",
          "[fused][kernels]") {
  torch::manual_seed(2);
  const bool residual = GENERATE(true, false);
  INFO("residual " << residual);
  // Modulation views as the model makes them: chunks of one [B, 3W] tensor.
  auto mod = randn({2, 96}) * 0.3;
  auto gate_mod = randn({2, 96});
  std::vector<torch::Tensor> in = {randn({2, 7, 32}), residual ? randn({2, 7, 32}) : torch::Tensor(),
                                   residual ? gate_mod.narrow(1, 64, 32).unsqueeze(1) : torch::Tensor(),
                                   mod.narrow(1, 0, 32).unsqueeze(1), mod.narrow(1, 32, 32).unsqueeze(1)};
  std::vector<torch::Tensor> seeds = {randn({2, 7, 32}), randn({2, 7, 32})};
  auto [out_f, grad_f] = run_with_grads(ada_fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ada_ref, in, seeds);
  const torch::Tensor h = residual ? in[0] + in[2].contiguous() * in[1] : in[0];
  CHECK(rel_err(out_r[0], h) < 1e-15);
  CHECK(rel_err(out_r[1], rms_loops(h, in[3], in[4], 7, 1e-6)) < 1e-14);
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("The fused RoPE+QKV wrapper matches autograd of its reference, with and without prefix queries",
          "[fused][kernels]") {
  torch::manual_seed(3);
  const bool prefix_q = GENERATE(true, false);
  INFO("prefix_q " << prefix_q);
  const int64_t b = 2, p = 6, s = 3, h = 4, hk = 1, d = 16;
  auto [cos, sin] = rope_tables(b, p + s, d, torch::kFloat64);
  std::vector<torch::Tensor> in = {randn({b, p, ((prefix_q ? h : 0) + 2 * hk) * d}), randn({b, s, (h + 2 * hk) * d})};
  auto fused = [&](const std::vector<torch::Tensor>& x) {
    auto o = k::rope_qkv(x[0], x[1], cos, sin, h, hk, prefix_q);
    return std::vector<torch::Tensor>{o.q, o.k, o.v};
  };
  auto ref = [&](const std::vector<torch::Tensor>& x) {
    auto o = k::rope_qkv_ref(x[0], x[1], cos, sin, h, hk, prefix_q);
    return std::vector<torch::Tensor>{o.q, o.k, o.v};
  };
  const int64_t tq = prefix_q ? p + s : s;
  std::vector<torch::Tensor> seeds = {randn({b, h, tq, d}), randn({b, hk, p + s, d}), randn({b, hk, p + s, d})};
  auto [out_f, grad_f] = run_with_grads(fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ref, in, seeds);
  {
    // Prefix positions first; a prefix row holds [q (with prefix_q), k, v] heads, a suffix row [q, k, v].
    const int64_t pq = prefix_q ? h : 0;
    const auto k_want =
        at::cat({heads_loops(in[0], pq, hk, d, 0, cos, sin, true), heads_loops(in[1], h, hk, d, p, cos, sin, true)}, 2);
    const auto v_want = at::cat(
        {heads_loops(in[0], pq + hk, hk, d, 0, cos, sin, false), heads_loops(in[1], h + hk, hk, d, p, cos, sin, false)},
        2);
    const auto q_want =
        prefix_q
            ? at::cat({heads_loops(in[0], 0, h, d, 0, cos, sin, true), heads_loops(in[1], 0, h, d, p, cos, sin, true)},
                      2)
            : heads_loops(in[1], 0, h, d, p, cos, sin, true);
    CHECK(rel_err(out_r[0], q_want) < 1e-14);
    CHECK(rel_err(out_r[1], k_want) < 1e-14);
    CHECK(rel_err(out_r[2], v_want) < 1e-15);
  }
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("merged_linear equals separate Linears, with and without biases, gradients included", "[fused][kernels]") {
  torch::manual_seed(4);
  const bool with_bias = GENERATE(true, false);
  INFO("bias " << with_bias);
  std::vector<torch::Tensor> in = {randn({2, 5, 16}), randn({8, 16}), randn({4, 16}), randn({4, 16})};
  if (with_bias) {
    for (int64_t n : {8, 4, 4}) in.push_back(randn({n}));
  }
  auto fused = [&](const std::vector<torch::Tensor>& x) {
    std::vector<torch::Tensor> biases;
    if (with_bias) biases = {x[4], x[5], x[6]};
    return std::vector<torch::Tensor>{k::merged_linear(x[0], {x[1], x[2], x[3]}, biases)};
  };
  auto ref = [&](const std::vector<torch::Tensor>& x) {
    std::vector<torch::Tensor> parts;
    for (int i = 0; i < 3; ++i) parts.push_back(at::linear(x[0], x[1 + i], with_bias ? x[4 + i] : torch::Tensor()));
    return std::vector<torch::Tensor>{at::cat(parts, -1)};
  };
  std::vector<torch::Tensor> seeds = {randn({2, 5, 16})};
  auto [out_f, grad_f] = run_with_grads(fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ref, in, seeds);
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("geglu_linear equals down(gelu_tanh(gate) * up) with the activation recomputed in backward",
          "[fused][kernels]") {
  torch::manual_seed(5);
  std::vector<torch::Tensor> in = {randn({3, 4, 2 * 24}), randn({16, 24})};
  auto fused = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{k::geglu_linear(x[0], x[1], torch::Tensor(), "")};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{at::linear(k::geglu_ref(x[0]), x[1])};
  };
  {
    // geglu_ref and its analytic backward against gelu_tanh(gate) * up written out.
    const auto merged = in[0].detach().clone().requires_grad_(true);
    const auto want = gelu_tanh_formula(merged.narrow(-1, 0, 24)) * merged.narrow(-1, 24, 24);
    CHECK(rel_err(k::geglu_ref(in[0]), want) < 1e-14);
    const auto g = randn({3, 4, 24});
    const auto want_grad = torch::autograd::grad({want}, {merged}, {g})[0];
    CHECK(rel_err(k::geglu_backward_ref(g, in[0]), want_grad) < 1e-14);
  }
  std::vector<torch::Tensor> seeds = {randn({3, 4, 16})};
  auto [out_f, grad_f] = run_with_grads(fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ref, in, seeds);
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("The fused LayerNorm wrapper matches autograd of its reference, with and without the residual",
          "[fused][kernels]") {
  torch::manual_seed(6);
  const bool residual = GENERATE(true, false);
  INFO("residual " << residual);
  std::vector<torch::Tensor> in = {randn({3, 5, 40}) * 2 + 0.5, residual ? randn({3, 5, 40}) : torch::Tensor(),
                                   randn({40}) * 0.3 + 1, randn({40}) * 0.1};
  auto fused = [](const std::vector<torch::Tensor>& x) {
    auto o = k::layer_norm_residual(x[0], x[1], x[2], x[3], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    auto o = k::layer_norm_residual_ref(x[0], x[1], x[2], x[3], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  std::vector<torch::Tensor> seeds = {randn({3, 5, 40}), randn({3, 5, 40})};
  auto [out_f, grad_f] = run_with_grads(fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ref, in, seeds);
  const torch::Tensor h = residual ? in[0] + in[1] : in[0];
  CHECK(rel_err(out_r[1], layer_norm_loops(h, in[2], in[3], 1e-6)) < 1e-13);
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("gelu_linear equals fc2(gelu_tanh(pre)) with the activation rebuilt in backward", "[fused][kernels]") {
  torch::manual_seed(7);
  const bool with_bias = GENERATE(true, false);
  INFO("bias " << with_bias);
  std::vector<torch::Tensor> in = {randn({3, 4, 24}) * 2, randn({16, 24}), with_bias ? randn({16}) : torch::Tensor()};
  auto fused = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{k::gelu_linear(x[0], x[1], x[2], "")};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{at::linear(k::gelu_ref(x[0]), x[1], x[2])};
  };
  CHECK(rel_err(k::gelu_ref(in[0]), gelu_tanh_formula(in[0])) < 1e-14);
  std::vector<torch::Tensor> seeds = {randn({3, 4, 16})};
  auto [out_f, grad_f] = run_with_grads(fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ref, in, seeds);
  check_all(out_f, out_r, 1e-14, "output");
  check_all(grad_f, grad_r, 1e-12, "gradient");
}

TEST_CASE("split_qkv_heads gives the narrow-and-transpose views and their gradient", "[fused][kernels]") {
  torch::manual_seed(8);
  const int64_t b = 2, t = 5, h = 3, d = 4, w = h * d;
  auto fused = [&](const std::vector<torch::Tensor>& x) {
    auto o = k::split_qkv_heads(x[0] * 1.0, h);
    return std::vector<torch::Tensor>{o.q, o.k, o.v};
  };
  auto ref = [&](const std::vector<torch::Tensor>& x) {
    auto part = [&](int64_t i) { return x[0].narrow(-1, i * w, w).view({b, t, h, d}).transpose(1, 2); };
    return std::vector<torch::Tensor>{part(0), part(1), part(2)};
  };
  std::vector<torch::Tensor> seeds = {randn({b, h, t, d}), randn({b, h, t, d}), randn({b, h, t, d})};
  const std::vector<torch::Tensor> in = {randn({b, t, 3 * w})};
  auto [out_f, grad_f] = run_with_grads(fused, in, seeds);
  auto [out_r, grad_r] = run_with_grads(ref, in, seeds);
  check_all(out_f, out_r, 1e-15, "output");
  check_all(grad_f, grad_r, 1e-15, "gradient");
  // The outputs are views of the merged tensor (no copy).
  auto qkv = randn({b, t, 3 * w});
  auto views = k::split_qkv_heads(qkv, h);
  CHECK(views.k.data_ptr() == static_cast<char*>(qkv.data_ptr()) + w * qkv.element_size());
}

TEST_CASE("gather_rows and spread_rows move the listed rows and are each other's backward", "[fused][kernels]") {
  torch::manual_seed(9);
  // [2, 3] rows of width 4; rows 4, 0, 2 listed (slots: their places; 3 or more for the rest).
  const auto rows = torch::tensor({4, 0, 2}, torch::kLong);
  const auto slots = torch::tensor({1, 3, 2, 4, 0, 5}, torch::kLong);
  const auto x = randn({2, 3, 4});
  auto gathered = k::gather_rows(x, rows, slots);
  CHECK(torch::equal(gathered, x.reshape({6, 4}).index_select(0, rows)));
  const auto y = randn({3, 4});
  auto spread = k::spread_rows(y, rows, slots, {2, 3, 4});
  CHECK(spread.sizes() == torch::IntArrayRef{2, 3, 4});
  CHECK(torch::equal(spread.reshape({6, 4}).index_select(0, rows), y));
  for (int64_t r : {1, 3, 5}) CHECK(torch::equal(spread.reshape({6, 4})[r], torch::zeros({4}, torch::kFloat64)));
  // Gradients: the gather's is the spread of its output gradient, and the other way round.
  const std::vector<torch::Tensor> seed_rows = {randn({3, 4})}, seed_all = {randn({2, 3, 4})};
  auto [out_g, grad_g] = run_with_grads(
      [&](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{k::gather_rows(in[0], rows, slots)};
      },
      {x}, seed_rows);
  CHECK(torch::equal(grad_g[0], k::spread_rows(seed_rows[0], rows, slots, {2, 3, 4})));
  auto [out_s, grad_s] = run_with_grads(
      [&](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{k::spread_rows(in[0], rows, slots, {2, 3, 4})};
      },
      {y}, seed_all);
  CHECK(torch::equal(grad_s[0], k::gather_rows(seed_all[0], rows, slots)));
  // Bad inputs are named.
  CHECK_THROWS_WITH(k::gather_rows(x, rows.to(torch::kInt), slots),
                    Catch::Contains("gather_rows: rows must be an int64"));
  CHECK_THROWS_WITH(k::gather_rows(x, rows, slots.narrow(0, 0, 5)),
                    Catch::Contains("slots must be an int64 [6] tensor (one per row)"));
  CHECK_THROWS_WITH(k::spread_rows(y, rows, slots, {2, 3, 5}), Catch::Contains("sizes must end in y's width 4"));
  CHECK_THROWS_WITH(k::spread_rows(y.narrow(0, 0, 2), rows, slots, {2, 3, 4}),
                    Catch::Contains("spread_rows: y must have one row per listed row (3)"));
}

TEST_CASE("bias_grad on the CPU is ATen's sum over rows, cast to the parameter dtype", "[fused][kernels]") {
  const auto g = randn({3, 5, 24}, torch::kFloat32);
  CHECK(torch::equal(k::bias_grad(g, torch::kFloat32), g.reshape({-1, 24}).sum(0)));
  const auto got = k::bias_grad(g, torch::kFloat64);
  CHECK(got.scalar_type() == torch::kFloat64);
  CHECK(torch::equal(got, g.reshape({-1, 24}).sum(0).to(torch::kFloat64)));
}

TEST_CASE("The model's fused structure gives the reference loss and gradients on the CPU (fp64, tiny)",
          "[fused][model]") {
  using namespace vlatune::model;
  const auto cfg = Pi05Config::tiny();
  Pi05 net(cfg, torch::kCPU, torch::kFloat64);
  init_weights(*net, 11);
  torch::Generator gen = at::detail::createCPUGenerator(5);
  auto batch = batch_to(make_random_batch(cfg, 3, 3, 2, 24, 3, 20, 5, &gen, torch::kCPU), torch::kFloat64);
  // Recompute inside a layer (attention, MLPs) and of whole layers must not change it either.
  const bool recompute = GENERATE(false, true);
  INFO("recompute " << recompute);
  net->set_recompute(recompute ? std::vector<std::string>{"paligemma_with_expert.paligemma.model.language_model."
                                                          "layers.0.self_attn",
                                                          "paligemma_with_expert.gemma_expert.model.layers.0.mlp",
                                                          "paligemma_with_expert.paligemma.model.language_model."
                                                          "layers.1"}
                               : std::vector<std::string>{});
  auto run = [&](Kernels kernels) {
    ForwardOptions o;
    o.kernels = kernels;
    net->zero_grad(/*set_to_none=*/true);
    auto out = net->forward(batch, o);
    out.loss.backward();
    net->fill_missing_grads();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : net->named_parameters()) grads[item.key()] = item.value().grad().clone();
    return std::make_pair(out, grads);
  };
  auto [ref, ref_grads] = run(Kernels::kReference);
  auto [fused, fused_grads] = run(Kernels::kFused);
  CHECK(rel_err(fused.loss, ref.loss) < 1e-12);
  CHECK(rel_err(fused.velocity, ref.velocity) < 1e-12);
  double largest = 0;
  for (const auto& [name, g] : ref_grads) largest = std::max(largest, g.abs().max().item<double>());
  for (const auto& [name, g] : ref_grads) {
    INFO(name);
    // Max abs difference against the largest gradient of the model: k_proj.bias gradients are zero by symmetry.
    CHECK((fused_grads.at(name) - g).abs().max().item<double>() <= 1e-10 * largest);
  }
  net->set_recompute({});
}

// ---------------------------------------------------------------------------------------------- GPU ([.gpu])
//
// Inputs are drawn in the tested dtype; the reference runs on the same values upcast to fp64 (CPU), so the error
// is the kernel's own rounding. Bounds (METHOD.md): fp32 outputs < 1e-5; bf16 outputs are rounded once per
// stored tensor (2^-9 relative per element) plus the reference's intermediate roundings they reproduce: < 1e-2.
// Gradients pass through one or two more bf16 roundings: < 2e-2 (fp32: < 1e-4).

namespace {

struct Tol {
  double out, grad;
};
Tol tol_for(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 ? Tol{1e-2, 2e-2} : Tol{1e-5, 1e-4};
}

std::vector<torch::Tensor> to_device(const std::vector<torch::Tensor>& ts, torch::Device device, torch::Dtype dtype) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.to(device, dtype) : t);
  return out;
}

template <typename Fused, typename Ref>
void check_gpu_op(Fused&& fused, Ref&& ref, const std::vector<torch::Tensor>& inputs_f64,
                  const std::vector<torch::Tensor>& seeds_f64, torch::Dtype dtype, const char* what) {
  const Tol tol = tol_for(dtype);
  // The tested values: drawn in fp64, rounded to the dtype; the reference sees exactly those values.
  auto in_dev = to_device(inputs_f64, torch::kCUDA, dtype);
  auto seeds_dev = to_device(seeds_f64, torch::kCUDA, dtype);
  auto in_ref = to_device(in_dev, torch::kCPU, torch::kFloat64);
  auto [out_f, grad_f] = run_with_grads(fused, in_dev, seeds_dev);
  torch::cuda::synchronize();
  auto [out_r, grad_r] = run_with_grads(ref, in_ref, to_device(seeds_dev, torch::kCPU, torch::kFloat64));
  for (size_t i = 0; i < out_f.size(); ++i) {
    INFO(what << " output " << i);
    CHECK(out_f[i].is_cuda());
    CHECK(out_f[i].scalar_type() == dtype);
    CHECK(all_finite(out_f[i]));
    CHECK(rel_err(out_f[i], out_r[i]) < tol.out);
  }
  for (size_t i = 0; i < grad_f.size(); ++i) {
    INFO(what << " gradient " << i);
    REQUIRE(grad_f[i].defined() == grad_r[i].defined());
    if (!grad_f[i].defined()) continue;
    CHECK(all_finite(grad_f[i]));
    CHECK(rel_err(grad_f[i], grad_r[i]) < tol.grad);
  }
}

}  // namespace

TEST_CASE("The CUDA RMSNorm kernels match the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto width = GENERATE(32, 64, 1024, 2048, 4096);
  const bool residual = GENERATE(true, false);
  INFO("dtype " << c10::toString(dtype) << " width " << width << " residual " << residual);
  torch::manual_seed(100 + width);
  const int64_t rows = 777;
  // A residual stream with an offset and a large spread, as in the model.
  std::vector<torch::Tensor> in = {randn({rows, width}) * 3 + 0.5, residual ? randn({rows, width}) : torch::Tensor(),
                                   randn({width}) * 0.2};
  REQUIRE(k::fused_kernels_apply(in[0].to(torch::kCUDA, dtype)));
  check_gpu_op(rms_fused, rms_ref, in, {randn({rows, width}), randn({rows, width})}, dtype, "rms_norm");
}

TEST_CASE("The CUDA adaRMS kernels match the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto width = GENERATE(32, 1024, 2048);
  const auto tokens = GENERATE(1, 50, 77);
  const bool residual = GENERATE(true, false);
  INFO("dtype " << c10::toString(dtype) << " width " << width << " tokens " << tokens << " residual " << residual);
  torch::manual_seed(200 + width + tokens);
  const int64_t batch = 5;
  auto mod = randn({batch, 3 * width}) * 0.5, gate_mod = randn({batch, 3 * width});
  auto fused = [&](const std::vector<torch::Tensor>& x) {
    // The modulation travels as one tensor so that the kernels read strided views of it, as in the model.
    auto m = x[3].unsqueeze(1).chunk(3, -1);
    auto g = x[2].defined() ? x[2].unsqueeze(1).chunk(3, -1)[2] : torch::Tensor();
    auto o = k::adarms_norm_residual(x[0], x[1], g, m[0], m[1], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  auto ref = [&](const std::vector<torch::Tensor>& x) {
    auto m = x[3].unsqueeze(1).chunk(3, -1);
    auto g = x[2].defined() ? x[2].unsqueeze(1).chunk(3, -1)[2] : torch::Tensor();
    auto o = k::adarms_norm_residual_ref(x[0], x[1], g, m[0], m[1], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  std::vector<torch::Tensor> in = {randn({batch, tokens, width}) * 2,
                                   residual ? randn({batch, tokens, width}) : torch::Tensor(),
                                   residual ? gate_mod : torch::Tensor(), mod};
  check_gpu_op(fused, ref, in, {randn({batch, tokens, width}), randn({batch, tokens, width})}, dtype, "adarms");
}

TEST_CASE("The CUDA RoPE+QKV kernels match the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const bool prefix_q = GENERATE(true, false);
  // Pi0.5 (8 q heads, 1 kv head of 256) and the tiny config (4 q heads of 16).
  const auto shape = GENERATE(std::vector<int64_t>{3, 37, 11, 8, 1, 256}, std::vector<int64_t>{2, 9, 5, 4, 1, 16},
                              std::vector<int64_t>{2, 20, 10, 4, 2, 64});
  const int64_t b = shape[0], p = shape[1], s = shape[2], h = shape[3], hk = shape[4], d = shape[5];
  INFO("dtype " << c10::toString(dtype) << " prefix_q " << prefix_q << " d " << d);
  torch::manual_seed(300 + d);
  auto [cos, sin] = rope_tables(b, p + s, d, torch::kFloat64);
  auto cos_dev = cos.to(torch::kCUDA, torch::kFloat32), sin_dev = sin.to(torch::kCUDA, torch::kFloat32);
  auto fused = [&](const std::vector<torch::Tensor>& x) {
    auto o = k::rope_qkv(x[0], x[1], cos_dev, sin_dev, h, hk, prefix_q);
    return std::vector<torch::Tensor>{o.q, o.k, o.v};
  };
  // The reference uses the same fp32 tables (the model builds them in fp32), upcast.
  auto cos_ref = cos_dev.to(torch::kCPU, torch::kFloat64), sin_ref = sin_dev.to(torch::kCPU, torch::kFloat64);
  auto ref = [&](const std::vector<torch::Tensor>& x) {
    auto o = k::rope_qkv_ref(x[0], x[1], cos_ref, sin_ref, h, hk, prefix_q);
    return std::vector<torch::Tensor>{o.q, o.k, o.v};
  };
  const int64_t tq = prefix_q ? p + s : s;
  std::vector<torch::Tensor> in = {randn({b, p, ((prefix_q ? h : 0) + 2 * hk) * d}), randn({b, s, (h + 2 * hk) * d})};
  check_gpu_op(fused, ref, in, {randn({b, h, tq, d}), randn({b, hk, p + s, d}), randn({b, hk, p + s, d})}, dtype,
               "rope_qkv");
}

TEST_CASE("The CUDA GeGLU kernels (inside geglu_linear) match the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto features = GENERATE(64, 1000, 4096);
  INFO("dtype " << c10::toString(dtype) << " features " << features);
  torch::manual_seed(400 + features);
  const int64_t rows = 333;
  // The activation alone (no GEMM: its error is the kernel's), then through geglu_linear.
  {
    auto merged = (randn({rows, 2 * features}) * 2).to(torch::kCUDA, dtype);
    auto got = k::geglu(merged);
    auto ref = k::geglu_ref(merged.to(torch::kCPU, torch::kFloat64));
    CHECK(all_finite(got));
    CHECK(rel_err(got, ref) < tol_for(dtype).out);
  }
  auto fused = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{k::geglu_linear(x[0], x[1], torch::Tensor(), "")};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{at::linear(k::geglu_ref(x[0]), x[1])};
  };
  // bf16 GEMMs accumulate in fp32 but round their outputs: the GEMM adds one rounding to each gradient.
  check_gpu_op(fused, ref, {randn({rows, 2 * features}) * 2, randn({48, features}) / 30}, {randn({rows, 48})}, dtype,
               "geglu_linear");
}

TEST_CASE("The CUDA LayerNorm kernels match the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  // bf16 widths up to 2048 run the warp-per-row forward (32: one vector on a few lanes; 1152: SigLIP's, 4.5
  // vectors per lane); 4096 bf16 and the fp32 ones past 1024 the block-per-row forward. The backward runs one warp
  // per row up to 5 vectors per lane (bf16 32, 1000: 4 per lane, some lanes short, 1152; fp32 32), else the block
  // kernel. 777 rows: a partial block; SigLIP's width with 6007 rows: more rows than resident warps, so each warp
  // takes several rows.
  const auto width = GENERATE(32, 1000, 1152, 2048, 4096);
  const bool residual = GENERATE(true, false);
  INFO("dtype " << c10::toString(dtype) << " width " << width << " residual " << residual);
  torch::manual_seed(600 + width);
  const int64_t rows = width == 1152 ? 6007 : 777;
  auto fused = [](const std::vector<torch::Tensor>& x) {
    auto o = k::layer_norm_residual(x[0], x[1], x[2], x[3], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    auto o = k::layer_norm_residual_ref(x[0], x[1], x[2], x[3], 1e-6);
    return std::vector<torch::Tensor>{o.h, o.y};
  };
  // An offset residual stream (the centring matters) and weights around 1, as SigLIP's.
  std::vector<torch::Tensor> in = {randn({rows, width}) * 3 + 2, residual ? randn({rows, width}) : torch::Tensor(),
                                   randn({width}) * 0.2 + 1, randn({width}) * 0.1};
  check_gpu_op(fused, ref, in, {randn({rows, width}), randn({rows, width})}, dtype, "layer_norm");
}

TEST_CASE("The CUDA column sums of backward partials match an fp64 sum", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  // Rows: 1 and 4 (adaRMS token splits: one row group), 31 and 32 (the switch to 16 row groups), 528 (the norms'
  // backward blocks on 132 SMs). Columns: less than a block, partial blocks, LayerNorm's 2 x 1152.
  const int64_t rows = GENERATE(1, 4, 31, 32, 528);
  const int64_t cols = GENERATE(7, 96, 2304, 98304 + 5);
  INFO("dtype " << c10::toString(dtype) << " rows " << rows << " cols " << cols);
  torch::manual_seed(rows * 131 + cols);
  const auto partials = (randn({rows, cols}) * 3).to(torch::kCUDA, torch::kFloat32);
  auto out = torch::full({cols}, std::nan(""), partials.options().dtype(dtype));
  k::ColumnSumParams p;
  p.dtype = dtype == torch::kBFloat16 ? k::ActDtype::kBf16 : k::ActDtype::kFp32;
  p.rows = rows;
  p.cols = cols;
  p.partials = partials.const_data_ptr<float>();
  p.out = out.data_ptr();
  k::launch_column_sums(p, nullptr);  // the legacy default stream, which torch's ops here run on as well
  torch::cuda::synchronize();
  const auto want = partials.to(torch::kCPU, torch::kFloat64).sum(0);
  // fp32 sums of up to 528 terms (~1e-6 relative); bf16 adds one rounding of the result (2^-9).
  CHECK(rel_err(out.to(torch::kCPU, torch::kFloat64), want) < (dtype == torch::kBFloat16 ? 1e-2 : 1e-5));
  CHECK_THROWS_AS(([&] {
                    k::ColumnSumParams bad = p;
                    bad.rows = 0;
                    k::launch_column_sums(bad, nullptr);
                  }()),
                  std::invalid_argument);
}

TEST_CASE("bias_grad on the GPU matches an fp64 sum over rows, kernel and fallback shapes", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  // Rows: one, fewer than a chunk's minimum, SigLIP's 16,384 (batch 32). Columns: one vector, SigLIP's widths
  // (1152, 3 x 1152, 4304: 538 vectors, a partial block), the merged adaRMS modulations; 12 bf16 columns are not
  // whole vectors (ATen's sum).
  const int64_t rows = GENERATE(1, 31, 16384);
  const int64_t cols = GENERATE(8, 12, 1152, 3456, 4304, 113664);
  if (rows * cols > int64_t{1} << 28) return;  // keep the case small
  INFO("dtype " << c10::toString(dtype) << " rows " << rows << " cols " << cols);
  torch::manual_seed(rows + cols);
  const auto g = randn({rows, cols}).to(torch::kCUDA, dtype);
  const auto got = k::bias_grad(g.view({1, rows, cols}), dtype);
  torch::cuda::synchronize();
  CHECK(got.scalar_type() == dtype);
  CHECK(got.sizes() == torch::IntArrayRef{cols});
  CHECK(all_finite(got));
  CHECK(rel_err(got, g.to(torch::kCPU, torch::kFloat64).sum(0)) < (dtype == torch::kBFloat16 ? 1e-2 : 1e-5));
  // In another dtype than the gradient's (fp32-master biases): the same sums, cast.
  if (dtype == torch::kBFloat16) CHECK(torch::equal(k::bias_grad(g, torch::kFloat32), got.to(torch::kFloat32)));
}

TEST_CASE("The CUDA spread of live rows copies the reference's bytes, and its gradient gathers them back",
          "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  // Widths: one 16-byte word (bf16 8), the backbone's 2,048 and its Q/K/V 2,560, a partial thread block (1,000 bf16 =
  // 125 words); 12 bf16 columns are not whole words (the reference path). Rows: a tiny one, the benchmark's 32 x 712.
  const int64_t width = GENERATE(8, 12, 1000, 2048, 2560);
  const int64_t n = GENERATE(5, 22784);
  INFO("dtype " << c10::toString(dtype) << " width " << width << " rows " << n);
  torch::manual_seed(n + width);
  const auto keep = torch::rand({n}) < 0.8;  // the live rows, then a few dead ones
  keep[0] = true;
  const auto order = std::get<1>(at::sort(keep.logical_not().to(torch::kUInt8), std::optional<bool>(true), 0));
  const int64_t live = std::min<int64_t>(n, keep.sum().item<int64_t>() + 1);
  const auto rows = order.narrow(0, 0, live);
  const auto slots = torch::empty_like(order).scatter_(0, order, torch::arange(n, torch::kLong));
  auto y = randn({live, width}).to(dtype);
  y[0][0] = -0.0;  // bytes, not values: a negative zero stays one
  const auto want = k::spread_rows(y, rows, slots, {n, width});
  const auto y_dev = y.to(torch::kCUDA).requires_grad_(true);
  const auto got = k::spread_rows(y_dev, rows.to(torch::kCUDA), slots.to(torch::kCUDA), {n, width});
  const auto seed = randn({n, width}).to(torch::kCUDA, dtype);
  (got.to(torch::kFloat64) * seed.to(torch::kFloat64)).sum().backward();
  torch::cuda::synchronize();
  CHECK(torch::equal(got.detach().to(torch::kCPU).view(torch::kByte), want.view(torch::kByte)));
  CHECK(torch::equal(y_dev.grad().to(torch::kCPU), seed.to(torch::kCPU).index_select(0, rows)));
  // The gather's gradient is the spread: the kernel again, on the gradient.
  const auto x_dev = randn({n, width}).to(torch::kCUDA, dtype).requires_grad_(true);
  const auto g_rows = randn({live, width}).to(torch::kCUDA, dtype);
  (k::gather_rows(x_dev, rows.to(torch::kCUDA), slots.to(torch::kCUDA)).to(torch::kFloat64) *
   g_rows.to(torch::kFloat64))
      .sum()
      .backward();
  CHECK(torch::equal(x_dev.grad().to(torch::kCPU), k::spread_rows(g_rows.to(torch::kCPU), rows, slots, {n, width})));
}

TEST_CASE("The CUDA GELU kernels (inside gelu_linear) match the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  const auto features = GENERATE(64, 4304);
  INFO("dtype " << c10::toString(dtype) << " features " << features);
  torch::manual_seed(700 + features);
  const int64_t rows = 333;
  {
    auto x = (randn({rows, features}) * 2).to(torch::kCUDA, dtype);
    auto got = k::gelu(x);
    CHECK(all_finite(got));
    CHECK(rel_err(got, k::gelu_ref(x.to(torch::kCPU, torch::kFloat64))) < tol_for(dtype).out);
  }
  auto fused = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{k::gelu_linear(x[0], x[1], x[2], "")};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{at::linear(k::gelu_ref(x[0]), x[1], x[2])};
  };
  check_gpu_op(fused, ref, {randn({rows, features}) * 2, randn({48, features}) / 30, randn({48})}, {randn({rows, 48})},
               dtype, "gelu_linear");
}

TEST_CASE("merged_linear on the GPU matches the fp64 reference", "[.gpu][fused]") {
  REQUIRE(torch::cuda::is_available());
  const auto dtype = GENERATE(torch::kBFloat16, torch::kFloat32);
  at::globalContext().setAllowTF32CuBLAS(false);
  torch::manual_seed(500);
  auto fused = [](const std::vector<torch::Tensor>& x) {
    return std::vector<torch::Tensor>{k::merged_linear(x[0], {x[1], x[2], x[3]}, {x[4], x[5], x[6]})};
  };
  auto ref = [](const std::vector<torch::Tensor>& x) {
    std::vector<torch::Tensor> parts;
    for (int i = 0; i < 3; ++i) parts.push_back(at::linear(x[0], x[1 + i], x[4 + i]));
    return std::vector<torch::Tensor>{at::cat(parts, -1)};
  };
  check_gpu_op(fused, ref,
               {randn({4, 100, 256}), randn({256, 256}) / 16, randn({64, 256}) / 16, randn({64, 256}) / 16,
                randn({256}), randn({64}), randn({64})},
               {randn({4, 100, 384})}, dtype, "merged_linear");
}

TEST_CASE("Full-size Pi0.5 with fused kernels stays within bf16 rounding of the reference path",
          "[.gpu][fused][model]") {
  REQUIRE(torch::cuda::is_available());
  using namespace vlatune::model;
  const auto cfg = Pi05Config::full();
  Pi05 net(cfg, torch::kCUDA, torch::kBFloat16);
  init_weights(*net, 0);
  torch::Generator gen = at::detail::createCPUGenerator(1);
  auto batch = make_random_batch(cfg, 4, 3, 2, 200, 20, 199, 50, &gen, torch::kCUDA);
  auto run = [&](Kernels kernels) {
    ForwardOptions o;
    o.kernels = kernels;
    net->zero_grad(/*set_to_none=*/true);
    torch::cuda::synchronize();
    auto out = net->forward(batch, o);
    out.loss.backward();
    net->fill_missing_grads();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : net->named_parameters()) grads[item.key()] = item.value().grad().to(torch::kFloat32);
    return std::make_pair(out, grads);
  };
  auto [ref, ref_grads] = run(Kernels::kReference);
  auto [fused, fused_grads] = run(Kernels::kAuto);
  const double loss_err = rel_err(fused.loss, ref.loss), vel_err = rel_err(fused.velocity, ref.velocity);
  double dot = 0, nf = 0, nr = 0, worst = 0;
  std::string worst_name;
  for (const auto& [name, g] : ref_grads) {
    const auto& f = fused_grads.at(name);
    REQUIRE(all_finite(f));
    dot += (f.to(torch::kFloat64) * g.to(torch::kFloat64)).sum().item<double>();
    nf += f.to(torch::kFloat64).square().sum().item<double>();
    nr += g.to(torch::kFloat64).square().sum().item<double>();
    if (g.numel() >= 4096 && name.find("k_proj.bias") == std::string::npos) {
      const double e = rel_err(f, g);
      if (e > worst) worst = e, worst_name = name;
    }
  }
  const double cosine = dot / std::sqrt(nf * nr);
  std::printf(
      "fused vs reference (full, bf16, batch 4): loss %.6f vs %.6f (rel %.2e), velocity rel %.2e, "
      "gradient cosine %.6f, worst per-tensor gradient rel %.2e (%s)\n",
      fused.loss.item<double>(), ref.loss.item<double>(), loss_err, vel_err, cosine, worst, worst_name.c_str());
  // The lean and materialized attention paths (test_model_gpu.cpp) agree to 2e-2 on the velocity: the same bound.
  CHECK(loss_err < 1e-2);
  CHECK(vel_err < 2e-2);
  CHECK(cosine > 0.99);
}
