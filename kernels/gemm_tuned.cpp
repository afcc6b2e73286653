// Torch side of the tuned GEMMs (contract: gemm_tuned.h; design: gemm.md): row-major tensors -> column-major
// cuBLASLt problems (gemm_lt.h), the ATen form of each problem as the baseline candidate, the per-stream cuBLASLt
// workspace, the switch, and the Linear autograd function.
#include "kernels/gemm_tuned.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "kernels/fused_ops.h"

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// -1: not read yet; 0 off; 1 on.
std::atomic<int> g_tuning{-1};

bool bias_ok(const at::Tensor& bias, const at::Tensor& like, int64_t n) {
  return !bias.defined() || (bias.dim() == 1 && bias.size(0) == n && bias.scalar_type() == like.scalar_type() &&
                             bias.device() == like.device());
}

bool linear_shapes_ok(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return x.defined() && weight.defined() && x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1) &&
         x.numel() > 0 && weight.numel() > 0 && weight.scalar_type() == x.scalar_type() &&
         weight.device() == x.device() && bias_ok(bias, x, weight.size(0));
}

bool linear_ok(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return gemm_tuning_applies(x) && linear_shapes_ok(x, weight, bias);
}

// Untuned CUDA bf16/fp16 Linears with a bias take TunedLinearFn too (ATen's GEMMs inside): its backward sums the
// bias gradient with kernels::bias_grad instead of the ATen column reduction at::linear's backward runs.
bool bias_linear_ok(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() && x.defined() && x.is_cuda() &&
         (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf) && linear_shapes_ok(x, weight, bias);
}

#ifdef VLATUNE_HAVE_CUDA

bool is_half(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// Both 2-D, non-empty, one dtype and device, inner sizes matching: what the tuned path takes.
bool mm_operands_ok(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && a.numel() > 0 &&
         b.numel() > 0 && b.scalar_type() == a.scalar_type() && b.device() == a.device() && gemm_tuning_applies(a);
}

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's own default on Hopper

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// How cuBLAS reads a 2-D tensor in place: row-major (unit column stride) or column-major (unit row stride), with a
// leading dimension of at least the contiguous extent. Size-1 dimensions may carry any stride.
struct BlasLayout {
  bool row_major;
  int64_t ld;
};
std::optional<BlasLayout> blas_layout(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1), s0 = t.stride(0), s1 = t.stride(1);
  if ((cols == 1 || s1 == 1) && (rows == 1 || s0 >= cols)) return BlasLayout{true, rows == 1 ? cols : s0};
  if ((rows == 1 || s0 == 1) && (cols == 1 || s1 >= rows)) return BlasLayout{false, cols == 1 ? rows : s1};
  return std::nullopt;
}

// The cuBLASLt workspace of (device, stream): allocated once from the caching allocator on that stream and kept.
// Only work enqueued on that stream uses it, so stream order serializes its users (forward and backward threads
// alike: they enqueue on the same stream); another stream gets its own. The map is never destroyed (autograd's
// device threads may still run at exit).
void* lt_workspace(c10::DeviceIndex device, cudaStream_t stream) {
  static std::mutex mutex;
  static auto* buffers = new std::map<std::pair<int, cudaStream_t>, at::DataPtr>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*buffers)[{device, stream}];
  if (!slot) slot = c10::cuda::CUDACachingAllocator::get()->allocate(kWorkspaceBytes);
  return slot.get();
}

// The baseline candidate: the ATen ops the problem replaces, writing the same outputs.
struct AtenForm {
  const at::Tensor* a;
  const at::Tensor* b;
  const at::Tensor* bias;
  at::Tensor* out;
  at::Tensor* row_sums;
  GemmEpilogue epilogue;

  static void run(void* self) {
    const auto& f = *static_cast<AtenForm*>(self);
    if (f.epilogue == GemmEpilogue::kBias)
      at::addmm_out(*f.out, *f.bias, *f.a, *f.b);
    else
      at::mm_out(*f.out, *f.a, *f.b);
    if (f.epilogue == GemmEpilogue::kBiasGradB) at::sum_out(*f.row_sums, *f.a, at::IntArrayRef{1});
  }
};

// out [M, N] row-major = a [M, K] b [K, N]; as cuBLAS sees it (column-major): out^T [N x M] = b^T a^T, i.e. A := b,
// B := a, m = N, n = M, k = K. A row-major b is b^T column-major (op N), a column-major one needs op T; same for a.
// out_shape: the returned output's sizes (M x N elements; empty: [M, N]), allocated as such, not a view (an output
// of a custom autograd function that is a view could not be modified in place later).
MmRowSums run_tuned(const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& bias_in, GemmEpilogue epilogue,
                    at::IntArrayRef out_shape = {}) {
  RECORD_FUNCTION("vlatune::tuned_gemm", std::vector<c10::IValue>());
  const at::NoGradGuard no_grad;  // the outputs are written through pointers: no autograd of their own
  const c10::cuda::CUDAGuard device_guard(a_in.device());
  std::optional<BlasLayout> la = blas_layout(a_in), lb = blas_layout(b_in);
  const at::Tensor a = la ? a_in : a_in.contiguous(), b = lb ? b_in : b_in.contiguous();
  if (!la) la = blas_layout(a);
  if (!lb) lb = blas_layout(b);
  at::Tensor bias = bias_in;
  if (epilogue == GemmEpilogue::kBias && (!bias.is_contiguous() || !aligned16(bias.const_data_ptr())))
    bias = bias.clone(at::MemoryFormat::Contiguous);  // a fresh allocation: 16-byte aligned, as cuBLASLt wants
  const int64_t m_rows = a.size(0), k = a.size(1), n_cols = b.size(1);
  MmRowSums r;
  r.out = out_shape.empty() ? at::empty({m_rows, n_cols}, a.options()) : at::empty(out_shape, a.options());
  at::Tensor out2d = out_shape.empty() ? r.out : r.out.view({m_rows, n_cols});
  if (epilogue == GemmEpilogue::kBiasGradB) r.row_sums = at::empty({m_rows}, a.options());

  GemmProblem p;
  p.device = a.get_device();
  p.dtype = a.scalar_type() == at::kBFloat16 ? GemmDtype::kBf16 : GemmDtype::kFp16;
  p.transa = !lb->row_major;
  p.transb = !la->row_major;
  p.m = n_cols;
  p.n = m_rows;
  p.k = k;
  p.lda = lb->ld;
  p.ldb = la->ld;
  p.ldd = n_cols;
  p.epilogue = epilogue;
  p.aligned = static_cast<uint8_t>((aligned16(b.const_data_ptr()) ? kGemmAlignA : 0) |
                                   (aligned16(a.const_data_ptr()) ? kGemmAlignB : 0) |
                                   (aligned16(r.out.const_data_ptr()) ? kGemmAlignD : 0));
  GemmPointers ptr;
  ptr.a = b.const_data_ptr();
  ptr.b = a.const_data_ptr();
  ptr.d = r.out.data_ptr();
  if (epilogue == GemmEpilogue::kBias) ptr.bias = const_cast<void*>(bias.const_data_ptr());  // read only
  if (epilogue == GemmEpilogue::kBiasGradB) ptr.bias = r.row_sums.data_ptr();

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  GemmContext ctx;
  ctx.handle = at::cuda::getCurrentCUDABlasLtHandle();
  ctx.stream = stream;
  ctx.workspace = lt_workspace(a.get_device(), stream);
  ctx.workspace_bytes = kWorkspaceBytes;
  AtenForm form{&a, &b, &bias, &out2d, &r.row_sums, epilogue};
  gemm_lt_run_tuned(p, ptr, ctx, GemmBaseline{&AtenForm::run, &form});
  return r;
}

#endif  // VLATUNE_HAVE_CUDA

// ------------------------------------------------------------------------------------------------ Linear

struct TunedLinearFn : public torch::autograd::Function<TunedLinearFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->save_for_backward({x, weight});
    return tuned_linear_forward(x, weight, bias.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    variable_list result(3);  // x, weight, bias
    if (!grads[0].defined()) return result;
    const int64_t n = weight.size(0), k = weight.size(1);
    const at::Tensor g = grads[0].reshape({-1, n});
    if (ctx->needs_input_grad(0)) result[0] = tuned_mm(g, weight).view(x.sizes());
    const bool want_w = ctx->needs_input_grad(1), want_b = has_bias && ctx->needs_input_grad(2);
    const at::Tensor x2 = x.reshape({-1, k});
    if (want_w && want_b && gemm_tuning_applies(g)) {
      MmRowSums r = tuned_mm_row_sums(g.t(), x2);  // dW = g^T x, db = sum of g over rows: one GEMM
      result[1] = std::move(r.out);
      result[2] = std::move(r.row_sums);
    } else {
      if (want_w) result[1] = tuned_mm(g.t(), x2);
      if (want_b) result[2] = bias_grad(g, g.scalar_type());
    }
    return result;
  }
};

}  // namespace

GemmTuning gemm_tuning_mode_from_env(const char* value) {
  if (value == nullptr) return GemmTuning::kOff;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "on" || v == "true" || v == "yes") return GemmTuning::kAll;
  return v == "bias" ? GemmTuning::kBiasGradients : GemmTuning::kOff;
}

GemmTuning gemm_tuning_mode() {
  int state = g_tuning.load(std::memory_order_relaxed);
  if (state < 0) {
    int expected = -1;
    g_tuning.compare_exchange_strong(expected,
                                     static_cast<int>(gemm_tuning_mode_from_env(std::getenv("VLATUNE_GEMM_TUNING"))));
    state = g_tuning.load();
  }
  return static_cast<GemmTuning>(state);
}

bool gemm_tuning_enabled() {
  return gemm_tuning_mode() != GemmTuning::kOff;
}

void set_gemm_tuning(GemmTuning mode) {
  g_tuning.store(static_cast<int>(mode));
}

void set_gemm_tuning(bool enabled) {
  set_gemm_tuning(enabled ? GemmTuning::kAll : GemmTuning::kOff);
}

bool gemm_tuning_applies(const at::Tensor& t) {
#ifdef VLATUNE_HAVE_CUDA
  return t.defined() && t.is_cuda() && is_half(t) && gemm_tuning_enabled();
#else
  (void)t;
  return false;
#endif
}

at::Tensor tuned_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
#ifdef VLATUNE_HAVE_CUDA
  if (gemm_tuning_mode() == GemmTuning::kAll && mm_operands_ok(a, b) && bias_ok(bias, a, b.size(1)))
    return run_tuned(a, b, bias, bias.defined() ? GemmEpilogue::kBias : GemmEpilogue::kNone).out;
#endif
  return bias.defined() ? at::addmm(bias, a, b) : at::mm(a, b);
}

MmRowSums tuned_mm_row_sums(const at::Tensor& a, const at::Tensor& b) {
#ifdef VLATUNE_HAVE_CUDA
  if (mm_operands_ok(a, b)) return run_tuned(a, b, at::Tensor(), GemmEpilogue::kBiasGradB);
#endif
  return {at::mm(a, b), a.sum(1)};
}

at::Tensor tuned_linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
#ifdef VLATUNE_HAVE_CUDA
  if (gemm_tuning_mode() == GemmTuning::kAll && linear_ok(x, weight, bias)) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return run_tuned(x.reshape({-1, x.size(-1)}), weight.t(), bias,
                     bias.defined() ? GemmEpilogue::kBias : GemmEpilogue::kNone, shape)
        .out;
  }
#endif
  return at::linear(x, weight, bias);
}

at::Tensor tuned_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!linear_ok(x, weight, bias) && !bias_linear_ok(x, weight, bias)) return at::linear(x, weight, bias);
  return TunedLinearFn::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

std::vector<GemmTuneRecord> gemm_tuning_records() {
  return gemm_lt_records();
}

std::string gemm_tuning_summary() {
  const std::vector<GemmTuneRecord> records = gemm_tuning_records();
  if (records.empty()) return "";
  int lt = 0;
  int64_t calls = 0;
  double kept_ms = 0, aten_ms = 0;
  for (const GemmTuneRecord& r : records) {
    lt += r.chosen >= 0 ? 1 : 0;
    calls += r.calls;
    kept_ms += static_cast<double>(r.calls) * r.chosen_ms;
    aten_ms += static_cast<double>(r.calls) * r.baseline_ms;
  }
  char line[256];
  std::snprintf(line, sizeof(line),
                "GEMM tuning: %zu problems, cuBLASLt kept for %d (ATen for %zu); %lld calls, estimated GPU time %.1f "
                "ms with the kept algorithms vs %.1f ms with ATen's (%+.1f%%)",
                records.size(), lt, records.size() - static_cast<size_t>(lt), static_cast<long long>(calls), kept_ms,
                aten_ms, aten_ms > 0 ? 100.0 * (kept_ms - aten_ms) / aten_ms : 0.0);
  return line;
}

void clear_gemm_tuning_cache() {
  gemm_lt_clear();
}

}  // namespace vlatune::kernels
