// kernels/gemm_tuned: on the CPU every entry point is the ATen op it replaces, bitwise (forward and backward); on
// the GPU ([.gpu]) the tuned GEMMs (ATen or a cuBLASLt candidate, whichever the first call measured fastest) stay
// within one bf16/fp16 GEMM rounding of an fp64 reference, on the model's operand layouts (transposed weights,
// strided column views of a merged gradient, misaligned row views, bias and bias-gradient epilogues); the cache
// keeps one choice per problem, and with tuning off the results are ATen's bit for bit.
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/fused_ops.h"
#include "kernels/gemm_tuned.h"
#include "model/layers.h"
#include "tensor_test_util.h"

namespace {

namespace k = vlatune::kernels;

torch::Tensor randn(std::vector<int64_t> shape, torch::Dtype dtype = torch::kFloat64) {
  return torch::randn(shape, torch::TensorOptions().dtype(torch::kFloat64)).to(dtype);
}

using vlatune::test::rel_err;

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
                                                         torch::equal(a.cpu(), b.cpu())));
}

struct LinearRun {
  torch::Tensor y, dx, dw, db;
};

// y = linear(x, w, b) and the gradients of sum(y * seed) with respect to x, w and b (b may be undefined).
template <typename Fn>
LinearRun run_linear(Fn&& fn, const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0,
                     const torch::Tensor& seed) {
  auto x = x0.detach().clone().requires_grad_(true), w = w0.detach().clone().requires_grad_(true);
  auto b = b0.defined() ? b0.detach().clone().requires_grad_(true) : torch::Tensor();
  auto y = fn(x, w, b);
  (y * seed).sum().backward();
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : torch::Tensor()};
}

// tuned_linear against at::linear: output and the gradients of x, w and b (b may be undefined), bit for bit.
void check_linear_is_aten(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          const torch::Tensor& seed) {
  auto got = run_linear([](auto& x, auto& w, auto& b) { return k::tuned_linear(x, w, b); }, x, w, b, seed);
  auto ref = run_linear([](auto& x, auto& w, auto& b) { return at::linear(x, w, b); }, x, w, b, seed);
  CHECK(bitwise_equal(got.y, ref.y));
  CHECK(bitwise_equal(got.dx, ref.dx));
  CHECK(bitwise_equal(got.dw, ref.dw));
  CHECK(bitwise_equal(got.db, ref.db));
}

size_t record_count() {
  return k::gemm_tuning_records().size();
}

}  // namespace

// ---------------------------------------------------------------------------------------------- CPU

TEST_CASE("tuned_linear on the CPU is at::linear bitwise, forward and backward, with and without bias",
          "[gemm][kernels]") {
  torch::manual_seed(11);
  const bool with_bias = GENERATE(true, false);
  const auto dtype = GENERATE(torch::kFloat64, torch::kFloat32, torch::kBFloat16);
  INFO("bias " << with_bias << " dtype " << c10::toString(dtype));
  const size_t records = record_count();
  auto x = randn({3, 7, 24}, dtype), w = randn({10, 24}, dtype) / 5, seed = randn({3, 7, 10}, dtype);
  auto b = with_bias ? randn({10}, dtype) : torch::Tensor();
  check_linear_is_aten(x, w, b, seed);
  // The autograd-free forward of the custom functions is at::linear too.
  CHECK(bitwise_equal(k::tuned_linear_forward(x, w, b), at::linear(x, w, b)));
  // A non-contiguous (transposed) input takes at::linear's matmul path: still the same op.
  auto xt = randn({3, 24, 7}, dtype).transpose(1, 2);
  CHECK(bitwise_equal(k::tuned_linear(xt, w, b), at::linear(xt, w, b)));
  CHECK(record_count() == records);  // nothing is tuned on the CPU
}

TEST_CASE("tuned_mm and tuned_mm_row_sums on the CPU are at::mm, at::addmm and sum, bitwise, on strided operands",
          "[gemm][kernels]") {
  torch::manual_seed(12);
  const auto dtype = GENERATE(torch::kFloat32, torch::kBFloat16);
  INFO("dtype " << c10::toString(dtype));
  const size_t records = record_count();
  auto x = randn({40, 24}, dtype), w = randn({30, 24}, dtype), g = randn({40, 96}, dtype), bias = randn({30}, dtype);
  auto gi = g.narrow(1, 32, 30);  // a strided column view, as merged_linear's per-member gradients
  CHECK(bitwise_equal(k::tuned_mm(x, w.t()), at::mm(x, w.t())));
  CHECK(bitwise_equal(k::tuned_mm(x, w.t(), bias), at::addmm(bias, x, w.t())));
  CHECK(bitwise_equal(k::tuned_mm(gi, w), at::mm(gi, w)));
  auto r = k::tuned_mm_row_sums(gi.t(), x);
  CHECK(bitwise_equal(r.out, at::mm(gi.t(), x)));
  CHECK(bitwise_equal(r.row_sums, gi.t().sum(1)));
  CHECK(record_count() == records);
}

TEST_CASE("VLATUNE_GEMM_TUNING values and the process-wide switch", "[gemm][kernels]") {
  CHECK(k::gemm_tuning_mode_from_env("0") == k::GemmTuning::kOff);
  CHECK(k::gemm_tuning_mode_from_env("off") == k::GemmTuning::kOff);
  CHECK(k::gemm_tuning_mode_from_env("FALSE") == k::GemmTuning::kOff);
  CHECK(k::gemm_tuning_mode_from_env("No") == k::GemmTuning::kOff);
  // Off unless asked for: in the full Pi0.5 step on the H200 the kept candidates bought nothing (kernels/gemm.md).
  CHECK(k::gemm_tuning_mode_from_env(nullptr) == k::GemmTuning::kOff);
  CHECK(k::gemm_tuning_mode_from_env("") == k::GemmTuning::kOff);
  CHECK(k::gemm_tuning_mode_from_env("2") == k::GemmTuning::kOff);
  CHECK(k::gemm_tuning_mode_from_env("1") == k::GemmTuning::kAll);
  CHECK(k::gemm_tuning_mode_from_env("on") == k::GemmTuning::kAll);
  CHECK(k::gemm_tuning_mode_from_env("TRUE") == k::GemmTuning::kAll);
  CHECK(k::gemm_tuning_mode_from_env("yes") == k::GemmTuning::kAll);
  CHECK(k::gemm_tuning_mode_from_env("Bias") == k::GemmTuning::kBiasGradients);
  CHECK(k::gemm_tuning_mode_from_env("bias") == k::GemmTuning::kBiasGradients);
  CHECK(k::gemm_tuning_mode_from_env("biases") == k::GemmTuning::kOff);
  const k::GemmTuning mode_before = k::gemm_tuning_mode();
  k::set_gemm_tuning(k::GemmTuning::kBiasGradients);
  CHECK(k::gemm_tuning_enabled());
  CHECK(k::gemm_tuning_mode() == k::GemmTuning::kBiasGradients);
  k::set_gemm_tuning(mode_before);
  const bool before = k::gemm_tuning_enabled();
  k::set_gemm_tuning(false);
  CHECK_FALSE(k::gemm_tuning_enabled());
  k::set_gemm_tuning(true);
  CHECK(k::gemm_tuning_enabled());
  // On when enabled only for CUDA bf16/fp16 tensors: never on the CPU.
  CHECK_FALSE(k::gemm_tuning_applies(torch::ones({2, 2}, torch::kBFloat16)));
  k::set_gemm_tuning(before);
}

// ---------------------------------------------------------------------------------------------- GPU ([.gpu])
//
// Inputs are drawn in the tested dtype; the reference runs on the same values upcast to fp64 (CPU), so the error is
// the GEMM's own: fp32 accumulation, one rounding of the output (2^-9 relative per element for bf16, 2^-12 for
// fp16). Bound for every output, bias sums included: relative Frobenius error < 1e-2 (bf16) / 2e-3 (fp16).

namespace {

// Tuning on for one test case (it is off by default), restored after.
struct TuningOn {
  bool before = k::gemm_tuning_enabled();
  TuningOn() { k::set_gemm_tuning(true); }
  ~TuningOn() { k::set_gemm_tuning(before); }
};

double tol_for(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 ? 1e-2 : 2e-3;
}

torch::Tensor dev(const torch::Tensor& t, torch::Dtype dtype) {
  return t.to(torch::kCUDA, dtype);
}

torch::Tensor f64(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, torch::kFloat64);
}

// The record of the problem whose cuBLAS sizes are (m, n, k) with this epilogue; null when absent.
const k::GemmTuneRecord* find_record(const std::vector<k::GemmTuneRecord>& records, int64_t m, int64_t n, int64_t kk,
                                     k::GemmEpilogue epilogue) {
  for (const auto& r : records)
    if (r.problem.m == m && r.problem.n == n && r.problem.k == kk && r.problem.epilogue == epilogue) return &r;
  return nullptr;
}

// The kept time is the minimum of the measured ones, and `chosen` points at it.
void check_choice(const k::GemmTuneRecord& r) {
  INFO(k::describe(r.problem) << " chosen " << r.chosen << " note '" << r.note << "'");
  CHECK(r.calls >= 1);
  CHECK(r.chosen >= -1);
  CHECK(r.chosen < static_cast<int>(r.candidate_ms.size()));
  float best = r.baseline_ms;
  for (float ms : r.candidate_ms) best = std::min(best, ms);
  CHECK(r.chosen_ms == best);
  CHECK(r.chosen_ms == (r.chosen < 0 ? r.baseline_ms : r.candidate_ms[static_cast<size_t>(r.chosen)]));
  CHECK(std::isfinite(r.baseline_ms));
  CHECK(r.baseline_ms > 0);
}

}  // namespace

TEST_CASE("Tuned GEMMs match the fp64 reference: forward, dgrad, wgrad, bias and bias-gradient epilogues",
          "[.gpu][gemm]") {
  REQUIRE(torch::cuda::is_available());
  TuningOn tuning_on;
  const auto dtype = GENERATE(torch::kBFloat16, torch::kHalf);
  // {M, K, N}: SigLIP's fc1 / fc2 (odd 1152 x 4304), a decoder projection, tiny and odd sizes.
  const auto shape =
      GENERATE(std::vector<int64_t>{333, 1152, 4304}, std::vector<int64_t>{256, 4304, 1152},
               std::vector<int64_t>{1000, 2048, 2560}, std::vector<int64_t>{37, 64, 48}, std::vector<int64_t>{5, 3, 7});
  const int64_t m = shape[0], kk = shape[1], n = shape[2];
  INFO("dtype " << c10::toString(dtype) << " M " << m << " K " << kk << " N " << n);
  torch::manual_seed(static_cast<uint64_t>(100 + m + kk + n));
  const double tol = tol_for(dtype);
  auto x = dev(randn({m, kk}), dtype), w = dev(randn({n, kk}) / std::sqrt(static_cast<double>(kk)), dtype);
  auto b = dev(randn({n}), dtype), g = dev(randn({m, n}), dtype);
  auto xr = f64(x), wr = f64(w), br = f64(b), gr = f64(g);

  auto fwd = k::tuned_mm(x, w.t());
  CHECK(fwd.scalar_type() == dtype);
  CHECK(rel_err(fwd, xr.mm(wr.t())) < tol);
  CHECK(rel_err(k::tuned_mm(x, w.t(), b), at::addmm(br, xr, wr.t())) < tol);
  CHECK(rel_err(k::tuned_mm(g, w), gr.mm(wr)) < tol);
  CHECK(rel_err(k::tuned_mm(g.t(), x), gr.t().mm(xr)) < tol);
  auto r = k::tuned_mm_row_sums(g.t(), x);
  CHECK(rel_err(r.out, gr.t().mm(xr)) < tol);
  CHECK(r.row_sums.scalar_type() == dtype);
  CHECK(rel_err(r.row_sums, gr.sum(0)) < tol);

  // Every problem got a record whose choice is the fastest measured; cuBLAS sizes: fwd (m=N, n=M, k=K) TN,
  // dgrad (m=K, n=M, k=N) NN, wgrad (m=K, n=N, k=M) NT.
  const auto records = k::gemm_tuning_records();
  const k::GemmTuneRecord* f = find_record(records, n, m, kk, k::GemmEpilogue::kNone);
  const k::GemmTuneRecord* fb = find_record(records, n, m, kk, k::GemmEpilogue::kBias);
  const k::GemmTuneRecord* dg = find_record(records, kk, m, n, k::GemmEpilogue::kNone);
  const k::GemmTuneRecord* wg = find_record(records, kk, n, m, k::GemmEpilogue::kNone);
  const k::GemmTuneRecord* wb = find_record(records, kk, n, m, k::GemmEpilogue::kBiasGradB);
  for (const auto* rec : {f, fb, dg, wg, wb}) {
    REQUIRE(rec != nullptr);
    check_choice(*rec);
  }
  CHECK((f->problem.transa && !f->problem.transb));
  CHECK((!dg->problem.transa && !dg->problem.transb));
  CHECK((!wg->problem.transa && wg->problem.transb));
  std::printf("%s\n", k::gemm_tuning_summary().c_str());
}

TEST_CASE("Tuned GEMMs read strided column views and misaligned row views in place and match the reference",
          "[.gpu][gemm]") {
  REQUIRE(torch::cuda::is_available());
  TuningOn tuning_on;
  torch::manual_seed(21);
  const auto dtype = torch::kBFloat16;
  const double tol = tol_for(dtype);
  const int64_t m = 300, kk = 256, n_total = 384, n = 64;
  auto x = dev(randn({m, kk}), dtype), g = dev(randn({m, n_total}), dtype);
  auto w = dev(randn({n, kk}) / 16, dtype);
  // merged_linear's per-member gradient: columns [128, 192) of the merged gradient, leading dimension 384.
  auto gi = g.narrow(1, 128, n);
  REQUIRE_FALSE(gi.is_contiguous());
  CHECK(rel_err(k::tuned_mm(gi.t(), x), f64(gi).t().mm(f64(x))) < tol);
  CHECK(rel_err(k::tuned_mm(gi, w), f64(gi).mm(f64(w))) < tol);
  auto r = k::tuned_mm_row_sums(gi.t(), x);
  CHECK(rel_err(r.out, f64(gi).t().mm(f64(x))) < tol);
  CHECK(rel_err(r.row_sums, f64(gi).sum(0)) < tol);
  auto records = k::gemm_tuning_records();
  const k::GemmTuneRecord* strided = find_record(records, kk, n, m, k::GemmEpilogue::kBiasGradB);
  REQUIRE(strided != nullptr);
  CHECK(strided->problem.ldb == n_total);  // read in place: the leading dimension of the merged gradient

  // A row view starting one element into its buffer (2 bytes: no 16-byte alignment), as a packed member's weight
  // with an odd row offset, and an odd-width activation.
  const int64_t k_odd = 1151;
  auto buffer = dev(randn({1 + 2 * k_odd * 8}), dtype);
  auto wm = buffer.narrow(0, 1, 16 * k_odd).view({16, k_odd});
  auto xm = dev(randn({m, k_odd}), dtype);
  REQUIRE(reinterpret_cast<uintptr_t>(wm.data_ptr()) % 16 != 0);
  CHECK(rel_err(k::tuned_mm(xm, wm.t()), f64(xm).mm(f64(wm).t())) < tol);
  CHECK(rel_err(k::tuned_mm(xm.narrow(1, 1, k_odd - 1), wm.narrow(1, 1, k_odd - 1).t()),
                f64(xm).narrow(1, 1, k_odd - 1).mm(f64(wm).narrow(1, 1, k_odd - 1).t())) < tol);
  records = k::gemm_tuning_records();
  const k::GemmTuneRecord* misaligned = find_record(records, 16, m, k_odd, k::GemmEpilogue::kNone);
  REQUIRE(misaligned != nullptr);
  CHECK((misaligned->problem.aligned & k::kGemmAlignA) == 0);  // the weight is cuBLAS's A
  check_choice(*misaligned);
}

TEST_CASE("The tuning cache keeps one choice per problem: the second call reuses it, bitwise", "[.gpu][gemm]") {
  REQUIRE(torch::cuda::is_available());
  TuningOn tuning_on;
  torch::manual_seed(31);
  k::clear_gemm_tuning_cache();
  REQUIRE(k::gemm_tuning_records().empty());
  auto x = dev(randn({2048, 1152}), torch::kBFloat16), w = dev(randn({4304, 1152}) / 32, torch::kBFloat16);
  auto b = dev(randn({4304}), torch::kBFloat16);
  auto first = k::tuned_mm(x, w.t(), b);
  auto records = k::gemm_tuning_records();
  REQUIRE(records.size() == 1);
  const k::GemmTuneRecord once = records[0];
  CHECK(once.calls == 1);
  check_choice(once);
  auto second = k::tuned_mm(x, w.t(), b);
  records = k::gemm_tuning_records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].calls == 2);
  CHECK(records[0].chosen == once.chosen);
  CHECK(records[0].candidate_ms == once.candidate_ms);  // not measured again
  // The first call's output comes from the kept algorithm too: the same bits as every later call.
  CHECK(bitwise_equal(first, second));
  std::printf("cache: %s -> %s (%.3f ms; ATen %.3f ms; %zu cuBLASLt candidates)\n", k::describe(once.problem).c_str(),
              once.chosen < 0 ? "ATen" : ("cuBLASLt #" + std::to_string(once.chosen)).c_str(), once.chosen_ms,
              once.baseline_ms, once.candidate_ms.size());
}

TEST_CASE("With tuning off the tuned entry points give ATen's results bitwise", "[.gpu][gemm]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(41);
  const bool before = k::gemm_tuning_enabled();
  k::set_gemm_tuning(false);
  const size_t records = record_count();
  const auto dtype = torch::kBFloat16;
  auto x = dev(randn({4, 150, 1152}), dtype), w = dev(randn({4304, 1152}) / 32, dtype), b = dev(randn({4304}), dtype);
  auto seed = dev(randn({4, 150, 4304}), dtype);
  check_linear_is_aten(x, w, torch::Tensor(), seed);
  {
    // With a bias, tuned_linear is its own node even untuned (ATen's GEMMs; the bias gradient by bias_grad): the
    // forward is at::linear's, the gradients match the fp64 reference.
    auto got = run_linear([](auto& x, auto& w, auto& b) { return k::tuned_linear(x, w, b); }, x, w, b, seed);
    auto ref =
        run_linear([](auto& x, auto& w, auto& b) { return at::linear(x, w, b); }, f64(x), f64(w), f64(b), f64(seed));
    CHECK(bitwise_equal(got.y, at::linear(x, w, b)));
    CHECK(got.db.scalar_type() == dtype);
    CHECK(rel_err(got.dx, ref.dx) < tol_for(dtype));
    CHECK(rel_err(got.dw, ref.dw) < tol_for(dtype));
    CHECK(rel_err(got.db, ref.db) < tol_for(dtype));
  }
  auto g = seed.reshape({-1, 4304}), x2 = x.reshape({-1, 1152});
  CHECK(bitwise_equal(k::tuned_mm(g, w), at::mm(g, w)));
  auto r = k::tuned_mm_row_sums(g.t(), x2);
  CHECK(bitwise_equal(r.out, at::mm(g.t(), x2)));
  CHECK(bitwise_equal(r.row_sums, g.t().sum(1)));
  CHECK(record_count() == records);
  k::set_gemm_tuning(before);
}

TEST_CASE("Tuning only bias gradients: the other GEMMs are ATen's bitwise, the row-sum GEMM is tuned", "[.gpu][gemm]") {
  REQUIRE(torch::cuda::is_available());
  torch::manual_seed(43);
  const k::GemmTuning before = k::gemm_tuning_mode();
  k::set_gemm_tuning(k::GemmTuning::kBiasGradients);
  const auto dtype = torch::kBFloat16;
  auto x = dev(randn({2, 130, 1152}), dtype), w = dev(randn({4304, 1152}) / 32, dtype), b = dev(randn({4304}), dtype);
  auto g = dev(randn({260, 4304}), dtype);
  auto x2 = x.reshape({-1, 1152});
  const size_t records = record_count();
  CHECK(bitwise_equal(k::tuned_mm(g, w), at::mm(g, w)));
  CHECK(bitwise_equal(k::tuned_linear_forward(x, w, b), at::linear(x, w, b)));
  CHECK(record_count() == records);  // nothing tuned yet
  auto r = k::tuned_mm_row_sums(g.t(), x2);
  CHECK(record_count() == records + 1);
  auto g64 = g.cpu().to(torch::kFloat64), x64 = x2.cpu().to(torch::kFloat64);
  CHECK(vlatune::test::rel_err(r.out, g64.t().mm(x64)) < 1e-2);
  CHECK(vlatune::test::rel_err(r.row_sums, g64.sum(0)) < 1e-2);
  k::set_gemm_tuning(before);
}

TEST_CASE("tuned_linear on the GPU matches the fp64 reference, forward and backward, with and without bias",
          "[.gpu][gemm]") {
  REQUIRE(torch::cuda::is_available());
  TuningOn tuning_on;
  const bool with_bias = GENERATE(true, false);
  const bool transposed_input = GENERATE(false, true);
  const auto dtype = GENERATE(torch::kBFloat16, torch::kHalf);
  INFO("bias " << with_bias << " transposed input " << transposed_input << " dtype " << c10::toString(dtype));
  torch::manual_seed(51);
  const double tol = tol_for(dtype);
  const int64_t batch = 3, tokens = 77, in = 1152, out = 432;
  auto x = transposed_input ? dev(randn({batch, in, tokens}), dtype).transpose(1, 2)
                            : dev(randn({batch, tokens, in}), dtype);
  auto w = dev(randn({out, in}) / 34, dtype), b = with_bias ? dev(randn({out}), dtype) : torch::Tensor();
  auto seed = dev(randn({batch, tokens, out}), dtype);
  auto got = run_linear([](auto& x, auto& w, auto& b) { return k::tuned_linear(x, w, b); }, x, w, b, seed);
  auto ref = run_linear([](auto& x, auto& w, auto& b) { return at::linear(x, w, b); }, f64(x), f64(w),
                        with_bias ? f64(b) : torch::Tensor(), f64(seed));
  CHECK(got.y.scalar_type() == dtype);
  CHECK(got.dw.scalar_type() == dtype);
  CHECK(rel_err(got.y, ref.y) < tol);
  CHECK(rel_err(got.dx, ref.dx) < tol);
  CHECK(rel_err(got.dw, ref.dw) < tol);
  REQUIRE(got.db.defined() == with_bias);
  if (with_bias) CHECK(rel_err(got.db, ref.db) < tol);
}

TEST_CASE("model::Linear on CUDA bf16 runs its three GEMMs through the tuner, bias gradient in the epilogue problem",
          "[.gpu][gemm][model]") {
  REQUIRE(torch::cuda::is_available());
  TuningOn tuning_on;
  torch::manual_seed(61);
  k::clear_gemm_tuning_cache();
  const int64_t in = 1152, out = 4304, rows = 2 * 129;
  vlatune::model::Linear fc1(in, out, /*bias=*/true,
                             torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
  {
    torch::NoGradGuard no_grad;
    fc1->weight.copy_(randn({out, in}) / 34);
    fc1->bias.copy_(randn({out}));
  }
  auto x = dev(randn({2, 129, in}), torch::kBFloat16).requires_grad_(true);
  auto y = fc1->forward(x);
  CHECK_FALSE(y.is_view());  // a custom function's view output could not be modified in place
  y.add_(0.5);
  (y.to(torch::kFloat32) * dev(randn({2, 129, out}), torch::kFloat32)).sum().backward();
  const auto records = k::gemm_tuning_records();
  CHECK(find_record(records, out, rows, in, k::GemmEpilogue::kBias) != nullptr);       // forward
  CHECK(find_record(records, in, rows, out, k::GemmEpilogue::kNone) != nullptr);       // dgrad
  CHECK(find_record(records, in, out, rows, k::GemmEpilogue::kBiasGradB) != nullptr);  // wgrad + bias gradient
  REQUIRE(fc1->weight.grad().defined());
  REQUIRE(fc1->bias.grad().defined());
  CHECK(fc1->bias.grad().scalar_type() == torch::kBFloat16);
}

TEST_CASE("merged_linear, geglu_linear and gelu_linear on CUDA bf16 take the tuned GEMMs", "[.gpu][gemm][fused]") {
  REQUIRE(torch::cuda::is_available());
  TuningOn tuning_on;
  torch::manual_seed(71);
  k::clear_gemm_tuning_cache();
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t rows = 200, width = 256, f = 512;
  auto x = torch::randn({rows, width}, opts).requires_grad_(true);
  auto wq = (torch::randn({width, width}, opts) / 16).requires_grad_(true);
  auto wk = (torch::randn({64, width}, opts) / 16).requires_grad_(true);
  auto bq = torch::randn({width}, opts).requires_grad_(true), bk = torch::randn({64}, opts).requires_grad_(true);
  auto merged = k::merged_linear(x, {wq, wk}, {bq, bk});
  auto down = (torch::randn({width, f}, opts) / 23).requires_grad_(true);
  auto fc2 = (torch::randn({width, f}, opts) / 23).requires_grad_(true), b2 = torch::randn({width}, opts);
  b2.requires_grad_(true);
  auto gate_up = torch::randn({rows, 2 * f}, opts).requires_grad_(true);
  auto pre = torch::randn({rows, f}, opts).requires_grad_(true);
  auto loss = merged.to(torch::kFloat32).sum() + k::geglu_linear(gate_up, down, torch::Tensor(), "").sum() +
              k::gelu_linear(pre, fc2, b2, "").to(torch::kFloat32).sum();
  loss.backward();
  const auto records = k::gemm_tuning_records();
  CHECK(find_record(records, width + 64, rows, width, k::GemmEpilogue::kBias) != nullptr);  // merged forward
  // Per-member weight gradients with their bias sums, reading strided column slices (ldb = width + 64).
  const k::GemmTuneRecord* member = find_record(records, width, 64, rows, k::GemmEpilogue::kBiasGradB);
  REQUIRE(member != nullptr);
  CHECK(member->problem.ldb == width + 64);
  CHECK(find_record(records, width, rows, f, k::GemmEpilogue::kNone) != nullptr);       // down / fc2 forward
  CHECK(find_record(records, f, width, rows, k::GemmEpilogue::kBiasGradB) != nullptr);  // fc2 dW + db
  for (const auto& t : {wq, wk, bq, bk, down, fc2, b2, x, gate_up, pre}) CHECK(t.grad().defined());
}
