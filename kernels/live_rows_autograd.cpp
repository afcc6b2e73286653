// gather_rows and spread_rows (contract: fused_ops.h): a subset of a tensor's rows and back, each the other's
// backward. The spread runs live_rows.cu's copy kernel on CUDA; its reference is zeros and index_copy_ (the same
// bytes: both copy).
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/fused_ops.h"
#include "kernels/live_rows.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y [R, w] -> [n, w]: row i = y[slots[i]] where slots[i] < R, else zero.
at::Tensor spread(const at::Tensor& y, const at::Tensor& rows, const at::Tensor& slots) {
  const int64_t n = slots.size(0), w = y.size(1);
  const int64_t row_bytes = w * static_cast<int64_t>(y.element_size());
#ifdef VLATUNE_HAVE_CUDA
  if (y.is_cuda() && row_bytes % 16 == 0 && n > 0) {
    const at::Tensor src = dense(y);
    const at::Tensor slot = slots.is_contiguous() ? slots : slots.contiguous();
    const c10::cuda::CUDAGuard guard(src.device());
    at::Tensor out = at::empty({n, w}, src.options());
    SpreadRowsParams p;
    p.rows = n;
    p.live = src.size(0);
    p.row_bytes = row_bytes;
    p.slots = slot.const_data_ptr<int64_t>();
    p.src = src.const_data_ptr();
    p.out = out.data_ptr();
    launch_spread_rows(p, stream_of(src));
    return out;
  }
#endif
  (void)row_bytes;
  return at::zeros({n, w}, y.options()).index_copy_(0, rows, y);
}

struct GatherRowsFn : public torch::autograd::Function<GatherRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& rows,
                            const at::Tensor& slots) {
    ctx->save_for_backward({rows, slots});
    ctx->saved_data["sizes"] = x.sizes().vec();
    return x.reshape({-1, x.size(-1)}).index_select(0, rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    return {spread(grads[0].contiguous(), saved[0], saved[1]).view(sizes), at::Tensor(), at::Tensor()};
  }
};

struct SpreadRowsFn : public torch::autograd::Function<SpreadRowsFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& rows, const at::Tensor& slots,
                            std::vector<int64_t> sizes) {
    ctx->save_for_backward({rows});
    return spread(y.contiguous(), rows, slots).view(sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor rows = ctx->get_saved_variables()[0];
    const at::Tensor g = grads[0].contiguous();
    return {g.view({-1, g.size(-1)}).index_select(0, rows), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// rows int64 [R] and slots int64 [n] on x's device, R <= n.
void check_rows(const char* op, const at::Tensor& x, const at::Tensor& rows, const at::Tensor& slots, int64_t n) {
  if (!rows.defined() || rows.dim() != 1 || rows.scalar_type() != at::kLong || rows.device() != x.device())
    fail(op, "rows must be an int64 [R] tensor on the device of x (" + describe(x) + ")", rows);
  if (!slots.defined() || slots.dim() != 1 || slots.scalar_type() != at::kLong || slots.device() != x.device() ||
      slots.size(0) != n)
    fail(op, "slots must be an int64 [" + std::to_string(n) + "] tensor (one per row) on the rows' device", slots);
  if (rows.size(0) > n) fail(op, "rows lists more rows than the " + std::to_string(n) + " there are", rows);
}

}  // namespace

at::Tensor gather_rows(const at::Tensor& x, const at::Tensor& rows, const at::Tensor& slots) {
  if (!x.defined() || x.dim() < 1) fail("gather_rows", "x must have a row dimension", x);
  check_rows("gather_rows", x, rows, slots, x.numel() / std::max<int64_t>(x.size(-1), 1));
  return GatherRowsFn::apply(x, rows, slots);
}

at::Tensor spread_rows(const at::Tensor& y, const at::Tensor& rows, const at::Tensor& slots,
                       std::vector<int64_t> sizes) {
  if (!y.defined() || y.dim() != 2) fail("spread_rows", "y must be [R, w]", y);
  if (sizes.empty() || sizes.back() != y.size(1))
    fail("spread_rows", "sizes must end in y's width " + std::to_string(y.size(1)), y);
  check_rows("spread_rows", y, rows, slots, c10::multiply_integers(sizes) / sizes.back());
  if (y.size(0) != rows.size(0))
    fail("spread_rows", "y must have one row per listed row (" + std::to_string(rows.size(0)) + ")", y);
  return SpreadRowsFn::apply(y, rows, slots, std::move(sizes));
}

}  // namespace vlatune::kernels
