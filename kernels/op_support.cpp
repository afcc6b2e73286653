#include "kernels/op_support.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <sstream>
#include <stdexcept>

#include "kernels/column_sums.h"
#include "kernels/fused_ops.h"
#include "profiler/scope.h"

#ifdef VLATUNE_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace vlatune::kernels {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << " " << t.sizes() << " on " << t.device();
  return os.str();
}

void fail(const std::string& op, const std::string& what, const at::Tensor& t) {
  throw std::invalid_argument(op + ": " + what + ", got " + describe(t));
}

void check_like(const std::string& op, const char* name, const at::Tensor& t, const at::Tensor& x) {
  if (!t.defined()) return;
  if (t.sizes() != x.sizes() || t.scalar_type() != x.scalar_type() || t.device() != x.device())
    fail(op, std::string(name) + " must match x (" + describe(x) + ")", t);
}

bool aligned16(const at::Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

at::Tensor dense(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

ActDtype act_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? ActDtype::kBf16 : ActDtype::kFp32;
}

at::ScalarType math_of(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor cast_like(const at::Tensor& t, const at::Tensor& x) {
  return t.scalar_type() == x.scalar_type() ? t : t.to(x.scalar_type());
}

std::vector<int64_t> keepdim_shape(const at::Tensor& t) {
  std::vector<int64_t> s = t.sizes().vec();
  s.back() = 1;
  return s;
}

CUstream_st* stream_of(const at::Tensor& t) {
#ifdef VLATUNE_HAVE_CUDA
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
  (void)t;
  return nullptr;
#endif
}

bool fused_kernels_apply(const at::Tensor& x) {
#ifdef VLATUNE_HAVE_CUDA
  return x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
#else
  (void)x;
  return false;
#endif
}

at::Tensor linear_in_scope(const at::Tensor& act, const at::Tensor& weight, const at::Tensor& bias,
                           const std::string& scope_fqn) {
  const at::Tensor b = bias.defined() ? cast_like(bias, act) : bias;
  if (scope_fqn.empty()) return at::linear(act, cast_like(weight, act), b);
  profiler::Scope scope(scope_fqn);
  return at::linear(act, cast_like(weight, act), b);
}

std::pair<at::Tensor, at::Tensor> linear_param_grads(const at::Tensor& g, const at::Tensor& act,
                                                     const at::Tensor& weight, const at::Tensor& bias, bool want_weight,
                                                     bool want_bias) {
  at::Tensor db = bias.defined() && want_bias ? bias_grad(g, bias.scalar_type()) : at::Tensor();
  return {want_weight ? at::mm(g.t(), act).to(weight.scalar_type()) : at::Tensor(), db};
}

at::Tensor sum_partials(const at::Tensor& partials, at::ScalarType dtype) {
  const bool kernel = partials.is_cuda() && partials.is_contiguous() && (dtype == at::kBFloat16 || dtype == at::kFloat);
  if (!kernel) return partials.sum(0).to(dtype);
  at::Tensor out = at::empty(partials.sizes().slice(1), partials.options().dtype(dtype));
#ifdef VLATUNE_HAVE_CUDA
  ColumnSumParams p;
  p.dtype = dtype == at::kBFloat16 ? ActDtype::kBf16 : ActDtype::kFp32;
  p.rows = partials.size(0);
  p.cols = out.numel();
  p.partials = partials.const_data_ptr<float>();
  p.out = out.data_ptr();
  launch_column_sums(p, stream_of(partials));
#endif
  return out;
}

}  // namespace vlatune::kernels
