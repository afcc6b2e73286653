// kernels/varlen_attention: the varlen layouts of Pi0.5's joint mask (CPU, by hand), and both backends
// (FlashAttention-2 varlen, cuDNN padding masks) against an fp64 masked-softmax reference on valid rows, gradients
// included ([.gpu]).
#include <torch/torch.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cudnn_sdpa.h"
#include "kernels/qkv_attention.h"
#include "kernels/varlen_attention.h"
#include "tensor_test_util.h"

namespace {

namespace k = vlatune::kernels;

std::vector<int64_t> values(const torch::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// valid [B, P + S] -> the model's mask [B, N, N]: i attends j iff block(j) <= block(i) and valid(j), or i == j.
torch::Tensor joint_mask(const torch::Tensor& valid, int64_t p) {
  const int64_t n = valid.size(1);
  auto block = torch::cat({torch::zeros({p}, torch::kLong), torch::ones({n - p}, torch::kLong)}).to(valid.device());
  auto allowed = block.unsqueeze(0) <= block.unsqueeze(1);
  auto eye = torch::eye(n, torch::TensorOptions().dtype(torch::kBool).device(valid.device()));
  return (allowed.unsqueeze(0) & valid.unsqueeze(1)) | eye;
}

}  // namespace

TEST_CASE("joint_varlen_layout packs each sample's allowed keys, prefix and suffix sequences", "[varlen][kernels]") {
  // B = 2, P = 3, S = 2; sample 1's valid prefix keys are not contiguous (an empty camera slot, say).
  auto valid = torch::tensor({1, 1, 0, 1, 1, 1, 0, 1, 1, 1}, torch::kBool).view({2, 5});
  SECTION("prefix and suffix queries") {
    const k::VarlenLayout l = k::joint_varlen_layout(valid, 3, /*prefix_queries=*/true);
    CHECK(values(l.cu_q) == std::vector<int64_t>{0, 3, 5, 8, 10});
    CHECK(values(l.cu_k) == std::vector<int64_t>{0, 2, 6, 8, 12});
    // Slots -> rows: (b0 prefix) 0 1 | (b0 suffix) 0 1 3 4 | (b1 prefix) 5 7 | (b1 suffix) 5 7 8 9 | unused: row 0.
    // (The extra slot 16, written by the rows without a slot, is not checked: any row, never read.)
    CHECK(l.slots == 16);
    CHECK(values(l.gather.narrow(0, 0, 16)) == std::vector<int64_t>{0, 1, 0, 1, 3, 4, 5, 7, 5, 7, 8, 9, 0, 0, 0, 0});
    // Rows -> slots; 16 for none (row 2, 6: padded prefix keys; suffix keys have no second slot).
    CHECK(values(l.first_slot) == std::vector<int64_t>{0, 1, 16, 4, 5, 6, 16, 7, 10, 11});
    CHECK(values(l.second_slot) == std::vector<int64_t>{2, 3, 16, 16, 16, 8, 16, 9, 16, 16});
    CHECK(l.rows_q == 10);
    CHECK(l.rows_k == 10);
    CHECK(l.max_q == 3);
    CHECK(l.max_k == 5);
  }
  SECTION("suffix queries alone (the last layer's dead prefix queries skipped)") {
    const k::VarlenLayout l = k::joint_varlen_layout(valid, 3, /*prefix_queries=*/false);
    CHECK(values(l.cu_q) == std::vector<int64_t>{0, 2, 4});
    CHECK(values(l.cu_k) == std::vector<int64_t>{0, 4, 8});
    CHECK(l.slots == 10);
    CHECK(values(l.gather.narrow(0, 0, 10)) == std::vector<int64_t>{0, 1, 3, 4, 5, 7, 8, 9, 0, 0});
    CHECK(values(l.first_slot) == std::vector<int64_t>{0, 1, 10, 2, 3, 4, 10, 5, 6, 7});
    CHECK_FALSE(l.second_slot.defined());
    CHECK(l.rows_q == 4);
    CHECK(l.max_q == 2);
  }
  SECTION("bad input is named") {
    CHECK_THROWS_WITH(k::joint_varlen_layout(valid.to(torch::kLong), 3, true),
                      Catch::Contains("varlen_attention: valid must be a [B, N] bool tensor"));
    CHECK_THROWS_WITH(k::joint_varlen_layout(valid, 6, true), Catch::Contains("prefix_len 6 outside [0, 5]"));
  }
}

TEST_CASE("joint_varlen_layout for cuDNN orders each sample's keys suffix, valid prefix, padded", "[varlen][kernels]") {
  auto valid = torch::tensor({1, 1, 0, 1, 1, 1, 0, 1, 1, 1}, torch::kBool).view({2, 5});
  const bool prefix_queries = GENERATE(true, false);
  const k::VarlenLayout l = k::joint_varlen_layout(valid, 3, prefix_queries, k::VarlenBackend::kCudnn);
  CHECK(l.backend == k::VarlenBackend::kCudnn);
  // Buffer rows -> key rows: sample 0: suffix 3 4, valid 0 1, padded 2; sample 1: suffix 8 9, valid 5 7, padded 6.
  CHECK(values(l.kv_order) == std::vector<int64_t>{3, 4, 0, 1, 2, 8, 9, 5, 7, 6});
  // Key rows -> buffer rows; the padded keys (rows 2, 6) -> 10, the zeroed extra row.
  CHECK(values(l.kv_grad_slot) == std::vector<int64_t>{2, 3, 10, 0, 1, 7, 10, 8, 5, 6});
  // Sample 0's last valid prefix position is 1 (its query 2 is padding, not computed), sample 1's is 2.
  CHECK(values(l.prefix_seq_q) == std::vector<int64_t>{2, 3});
  CHECK(values(l.prefix_seq_kv) == std::vector<int64_t>{2, 2});
  CHECK(values(l.suffix_seq_q) == std::vector<int64_t>{2, 2});
  CHECK(values(l.suffix_seq_kv) == std::vector<int64_t>{4, 4});
  CHECK(l.rows_q == (prefix_queries ? 10 : 4));
  CHECK(l.rows_k == 10);
  CHECK(l.batch == 2);
  CHECK(l.prefix_len == 3);
  CHECK(l.suffix_len == 2);
  CHECK_THROWS_WITH(k::joint_varlen_layout(valid, 5, true, k::VarlenBackend::kCudnn),
                    Catch::Contains("the cuDNN layout needs prefix and suffix positions (P 5, S 0)"));
}

TEST_CASE("suffix_queries_layout equals the layout built without prefix queries", "[varlen][kernels]") {
  auto valid = torch::tensor({1, 1, 0, 1, 1, 1, 0, 1, 1, 1}, torch::kBool).view({2, 5});
  const auto backend = GENERATE(k::VarlenBackend::kFlash, k::VarlenBackend::kCudnn);
  const k::VarlenLayout joint = k::joint_varlen_layout(valid, 3, true, backend);
  const k::VarlenLayout got = k::suffix_queries_layout(joint, valid);
  const k::VarlenLayout want = k::joint_varlen_layout(valid, 3, false, backend);
  CHECK(got.backend == want.backend);
  CHECK(got.rows_q == want.rows_q);
  CHECK(got.rows_k == want.rows_k);
  CHECK(got.max_q == want.max_q);
  CHECK(got.max_k == want.max_k);
  CHECK(got.slots == want.slots);
  CHECK(got.second_slot.defined() == want.second_slot.defined());
  auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() == b.defined() && (!a.defined() || values(a) == values(b));
  };
  CHECK(same(got.cu_q, want.cu_q));
  CHECK(same(got.cu_k, want.cu_k));
  CHECK(same(got.first_slot, want.first_slot));
  CHECK(same(got.kv_order, want.kv_order));
  CHECK(same(got.kv_grad_slot, want.kv_grad_slot));
  CHECK(same(got.prefix_seq_kv, want.prefix_seq_kv));
  CHECK(same(got.suffix_seq_kv, want.suffix_seq_kv));
  // cuDNN's key order and lengths are the joint layout's own tensors, not a second computation.
  if (backend == k::VarlenBackend::kCudnn) CHECK(got.kv_order.data_ptr() == joint.kv_order.data_ptr());
  CHECK_THROWS_WITH(k::suffix_queries_layout(want, valid), Catch::Contains("takes a layout with prefix queries"));
}

TEST_CASE("choose_varlen_backend follows the recipe's attention backend", "[varlen][kernels]") {
  const k::JointAttentionShape shape{2, 3, 2, 8, 1, 256, 1.0 / 16};
  const auto cpu = torch::zeros({1}, torch::kBFloat16);
  SECTION("flash is always possible") {
    CHECK(k::choose_varlen_backend(cpu, shape, k::AttentionBackend::kFlash) == k::VarlenBackend::kFlash);
  }
  SECTION("cudnn on CPU activations is an error with the reason") {
    CHECK_THROWS_WITH(k::choose_varlen_backend(cpu, shape, k::AttentionBackend::kCudnn),
                      Catch::Contains("model_options.attention_backend \"cudnn\": "));
  }
  SECTION("auto falls back on CPU activations") {
    CHECK(k::choose_varlen_backend(cpu, shape) == k::VarlenBackend::kFlash);
  }
  SECTION("sdpa runs no varlen attention, and SigLIP's attention leaves cuDNN only for flash") {
    const auto gpu_like = torch::zeros({1}, torch::kBFloat16);
    CHECK_FALSE(k::varlen_attention_supported(gpu_like, 256, k::AttentionBackend::kSdpa));
    CHECK_FALSE(
        k::qkv_attention_supported(torch::zeros({2, 4, 3 * 64}, torch::kBFloat16), 1, k::AttentionBackend::kFlash));
  }
  CHECK(std::string(k::to_string(k::VarlenBackend::kCudnn)) == "cudnn");
}

TEST_CASE("The cuDNN attention entry points refuse the CPU and describe their problem", "[varlen][kernels]") {
  CHECK_FALSE(k::qkv_attention_supported(torch::zeros({2, 4, 3 * 64}, torch::kBFloat16), 1));
  CHECK_THROWS_WITH(k::qkv_attention(torch::zeros({2, 4, 3 * 64}, torch::kBFloat16), 1, 0.125),
                    Catch::Contains("qkv_attention: "));
  k::SdpaProblem p;
  p.batch = 32;
  p.heads = 8;
  p.kv_heads = 1;
  p.seq_q = 50;
  p.seq_kv = 762;
  p.head_dim = 256;
  p.q_stride = {762 * 8 * 256, 256, 8 * 256, 1};
  const std::string text = k::describe(p);
  CHECK_THAT(text, Catch::Contains("batch 32, heads 8/1, seq 50x762, head_dim 256, padding mask"));
  CHECK_THAT(text, Catch::Contains("q[1560576,256,2048,1]"));
  if (!torch::cuda::is_available()) CHECK_FALSE(k::cudnn_sdpa_check(p, 0).empty());  // why not, never a crash
}

TEST_CASE("varlen_attention is not used on the CPU", "[varlen][kernels]") {
  CHECK_FALSE(k::varlen_attention_supported(torch::zeros({2, 3}, torch::kBFloat16), 256));
}

TEST_CASE("varlen_attention matches the masked fp64 reference on valid rows, gradients included", "[.gpu][varlen]") {
  REQUIRE(torch::cuda::is_available());
  const bool prefix_queries = GENERATE(true, false);
  const k::VarlenBackend backend = GENERATE(k::VarlenBackend::kFlash, k::VarlenBackend::kCudnn);
  // Pi0.5's heads (8 q, 1 kv, 256) and a smaller GQA shape.
  const auto shape = GENERATE(std::vector<int64_t>{3, 45, 11, 8, 1, 256}, std::vector<int64_t>{2, 20, 6, 4, 2, 64});
  const int64_t b = shape[0], p = shape[1], s = shape[2], h = shape[3], hk = shape[4], d = shape[5], n = p + s;
  INFO("prefix_queries " << prefix_queries << " d " << d << " backend " << k::to_string(backend));
  torch::manual_seed(700 + d);
  REQUIRE(k::varlen_attention_supported(torch::zeros({1}, torch::dtype(torch::kBFloat16).device(torch::kCUDA)), d));
  // Valid prefix keys: a contiguous run and, in sample 0, a hole (an absent camera's tokens).
  auto valid = torch::ones({b, n}, torch::kBool);
  for (int64_t i = 0; i < b; ++i) valid[i].narrow(0, p - 3 - 4 * i, 3 + 4 * i).fill_(false);
  valid[0].narrow(0, 2, 5).fill_(false);
  const int64_t tq = prefix_queries ? n : s;
  auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  auto q = torch::randn({b * tq, h, d}, opts).requires_grad_(true);
  auto kk = torch::randn({b * n, hk, d}, opts).requires_grad_(true);
  auto v = torch::randn({b * n, hk, d}, opts).requires_grad_(true);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const k::VarlenLayout layout = k::joint_varlen_layout(valid.to(torch::kCUDA), p, prefix_queries, backend);
  const auto branches = k::varlen_attention(q, kk, v, layout, scale);
  REQUIRE(branches.size() == (prefix_queries ? 2u : 1u));
  CHECK(branches.back().numel() == b * s * h * d);
  if (backend == k::VarlenBackend::kCudnn)
    for (const auto& o : branches) CHECK(o.is_contiguous());  // the o_proj inputs as they are
  auto out = prefix_queries ? torch::cat({branches[0].reshape({b, p, h, d}), branches[1].reshape({b, s, h, d})}, 1)
                            : branches[0];
  out = out.reshape({b * tq, h, d});
  REQUIRE(out.sizes() == q.sizes());

  // fp64 reference over [B, H, T, D] with the model's mask; dead rows (padded prefix queries) get no upstream
  // gradient, as in the model, where nothing reads them.
  auto mask = joint_mask(valid, p);
  if (!prefix_queries) mask = mask.narrow(1, p, s);
  const auto row_valid = prefix_queries ? valid : valid.narrow(1, p, s);
  auto q64 = q.detach().cpu().to(torch::kFloat64).view({b, tq, h, d}).transpose(1, 2).requires_grad_(true);
  auto k64 = kk.detach().cpu().to(torch::kFloat64).view({b, n, hk, d}).transpose(1, 2).requires_grad_(true);
  auto v64 = v.detach().cpu().to(torch::kFloat64).view({b, n, hk, d}).transpose(1, 2).requires_grad_(true);
  auto kr = k64.repeat_interleave(h / hk, 1), vr = v64.repeat_interleave(h / hk, 1);
  auto logits = torch::matmul(q64, kr.transpose(-1, -2)) * scale;
  logits = logits.masked_fill(mask.unsqueeze(1).logical_not(), -1e300);
  auto ref = torch::matmul(torch::softmax(logits, -1), vr).transpose(1, 2);  // [B, Tq, H, D]

  auto seed = torch::randn({b, tq, h, d}, torch::kFloat64) * row_valid.unsqueeze(-1).unsqueeze(-1);
  (out.to(torch::kFloat64).cpu().view({b, tq, h, d}) * seed).sum().backward();
  (ref * seed).sum().backward();

  auto rows = row_valid.reshape({-1});
  CHECK(vlatune::test::rel_err(out.view({b * tq, h, d}).cpu().index({rows}),
                               ref.reshape({b * tq, h, d}).index({rows})) < 1e-2);
  CHECK(vlatune::test::rel_err(q.grad(), q64.grad().transpose(1, 2).reshape({b * tq, h, d})) < 2e-2);
  CHECK(vlatune::test::rel_err(kk.grad(), k64.grad().transpose(1, 2).reshape({b * n, hk, d})) < 2e-2);
  CHECK(vlatune::test::rel_err(v.grad(), v64.grad().transpose(1, 2).reshape({b * n, hk, d})) < 2e-2);
  // Keys no query may see (padded prefix positions) get exactly zero gradient, dead queries too.
  auto dead_keys = valid.logical_not().reshape({-1});
  CHECK(kk.grad().cpu().index({dead_keys}).abs().max().item<float>() == 0.0f);
  const auto dead_rows = row_valid.logical_not().reshape({-1});
  if (dead_rows.any().item<bool>()) CHECK(q.grad().cpu().index({dead_rows}).abs().max().item<float>() == 0.0f);
  if (backend == k::VarlenBackend::kCudnn && prefix_queries) {
    // The padded queries after each sample's last valid prefix position are not computed: zero rows.
    auto after_last = torch::zeros({b, n}, torch::kBool);
    for (int64_t i = 0; i < b; ++i) after_last[i].narrow(0, p - 3 - 4 * i, 3 + 4 * i).fill_(true);
    CHECK(out.cpu().index({after_last.reshape({-1})}).abs().max().item<float>() == 0.0f);
  }
}

TEST_CASE("choose_varlen_backend picks cuDNN for Pi0.5's joint attention at batch 32", "[.gpu][varlen]") {
  REQUIRE(torch::cuda::is_available());
  const k::JointAttentionShape shape{32, 712, 50, 8, 1, 256, 1.0 / 16};
  const auto x = torch::zeros({1}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  CHECK(k::choose_varlen_backend(x, shape) == k::VarlenBackend::kCudnn);
  CHECK(k::choose_varlen_backend(x.to(torch::kHalf), shape) == k::VarlenBackend::kFlash);
  CHECK(k::varlen_attention_supported(x, 256));
  CHECK_FALSE(k::varlen_attention_supported(x, 256, k::AttentionBackend::kSdpa));
}

TEST_CASE("qkv_attention on cuDNN matches the fp64 reference from the merged QKV, its gradient in one tensor",
          "[.gpu][varlen]") {
  REQUIRE(torch::cuda::is_available());
  // SigLIP's heads (16 x 72) on 2 images of 256 tokens, and a smaller shape.
  const auto shape = GENERATE(std::vector<int64_t>{2, 256, 16, 72}, std::vector<int64_t>{3, 40, 4, 64});
  const int64_t n = shape[0], t = shape[1], h = shape[2], d = shape[3], w = h * d;
  torch::manual_seed(900 + d);
  auto qkv = torch::randn({n, t, 3 * w}, torch::dtype(torch::kBFloat16).device(torch::kCUDA)).requires_grad_(true);
  REQUIRE(k::qkv_attention_supported(qkv, h));
  CHECK_FALSE(k::qkv_attention_supported(qkv.detach().to(torch::kHalf), h));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto out = k::qkv_attention(qkv, h, scale);
  REQUIRE(out.sizes() == torch::IntArrayRef({n, t, w}));
  CHECK(out.is_contiguous());

  auto q64 = qkv.detach().cpu().to(torch::kFloat64).requires_grad_(true);
  auto heads = [&](int64_t i) { return q64.narrow(2, i * w, w).view({n, t, h, d}).transpose(1, 2); };
  auto probs = torch::softmax(torch::matmul(heads(0), heads(1).transpose(-1, -2)) * scale, -1);
  auto ref = torch::matmul(probs, heads(2)).transpose(1, 2).reshape({n, t, w});
  auto seed = torch::randn({n, t, w}, torch::kFloat64);
  (out.to(torch::kFloat64).cpu() * seed).sum().backward();
  (ref * seed).sum().backward();
  CHECK(vlatune::test::rel_err(out.cpu(), ref) < 1e-2);
  CHECK(vlatune::test::rel_err(qkv.grad(), q64.grad()) < 2e-2);
}
