// Merged-QKV self-attention on cuDNN (qkv_attention.h): the strided problem and its autograd node.
#include "kernels/qkv_attention.h"

#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#ifdef VLATUNE_HAVE_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/cudnn_sdpa.h"
#include "kernels/cudnn_sdpa_tensors.h"
#include "kernels/varlen_attention.h"
#endif

namespace vlatune::kernels {

#ifdef VLATUNE_HAVE_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// q, k, v: element offsets 0, W, 2 W into [N, T, 3 W]; o [N, T, W]; no mask.
SdpaProblem qkv_problem(int64_t n, int64_t t, int64_t width, int64_t heads, double scale) {
  const int64_t d = width / heads;
  SdpaProblem p;
  p.batch = n;
  p.heads = p.kv_heads = heads;
  p.seq_q = p.seq_kv = t;
  p.head_dim = d;
  p.q_stride = p.k_stride = p.v_stride = p.dq_stride = p.dk_stride = p.dv_stride = {t * 3 * width, d, 3 * width, 1};
  p.o_stride = {t * width, d, width, 1};
  p.scale = static_cast<float>(scale);
  p.padding_mask = false;
  return p;
}

struct QkvAttentionFn : public torch::autograd::Function<QkvAttentionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, int64_t heads, double scale) {
    const int64_t n = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3;
    const SdpaProblem p = qkv_problem(n, t, width, heads, scale);
    at::Tensor out = at::empty({n, t, width}, qkv.options());
    at::Tensor stats = at::empty({n, heads, t}, qkv.options().dtype(at::kFloat));
    SdpaWorkspaces workspaces(qkv.options());
    SdpaForwardArgs a;
    a.q = qkv.data_ptr();
    a.k = element_ptr(qkv, width);
    a.v = element_ptr(qkv, 2 * width);
    a.o = out.data_ptr();
    a.stats = stats.data_ptr<float>();
    cudnn_sdpa_forward(p, a, workspaces.allocator(), at::cuda::getCurrentCUDAStream());
    ctx->save_for_backward({qkv, out, stats});
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &qkv = saved[0], &out = saved[1], &stats = saved[2];
    const int64_t n = qkv.size(0), t = qkv.size(1), width = qkv.size(2) / 3;
    const SdpaProblem p =
        qkv_problem(n, t, width, ctx->saved_data["heads"].toInt(), ctx->saved_data["scale"].toDouble());
    const at::Tensor d_out = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(out);
    at::Tensor d_qkv = at::empty_like(qkv);
    SdpaWorkspaces workspaces(qkv.options());
    SdpaBackwardArgs a;
    a.q = qkv.data_ptr();
    a.k = element_ptr(qkv, width);
    a.v = element_ptr(qkv, 2 * width);
    a.o = out.data_ptr();
    a.d_o = d_out.data_ptr();
    a.stats = stats.data_ptr<float>();
    a.dq = d_qkv.data_ptr();
    a.dk = element_ptr(d_qkv, width);
    a.dv = element_ptr(d_qkv, 2 * width);
    cudnn_sdpa_backward(p, a, workspaces.allocator(), at::cuda::getCurrentCUDAStream());
    return {d_qkv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace
#endif

bool qkv_attention_supported(const at::Tensor& qkv, int64_t heads, AttentionBackend backend) {
#ifdef VLATUNE_HAVE_CUDA
  if (backend == AttentionBackend::kFlash) return false;
  if (!cudnn_sdpa_compiled() || !qkv.defined() || !qkv.is_cuda() || qkv.scalar_type() != at::kBFloat16 ||
      qkv.dim() != 3 || !qkv.is_contiguous() || heads <= 0 || qkv.size(2) % (3 * heads) != 0)
    return false;
  const int64_t width = qkv.size(2) / 3, d = width / heads;
  if (d % 8 != 0 || d > 256) return false;
  // cudnn_sdpa_check answers each shape once.
  return cudnn_sdpa_check(qkv_problem(qkv.size(0), qkv.size(1), width, heads, 1.0 / std::sqrt(static_cast<double>(d))),
                          qkv.device().index())
      .empty();
#else
  (void)qkv;
  (void)heads;
  (void)backend;
  return false;
#endif
}

at::Tensor qkv_attention(const at::Tensor& qkv, int64_t heads, double scale) {
#ifdef VLATUNE_HAVE_CUDA
  if (!qkv_attention_supported(qkv, heads))
    throw std::invalid_argument("qkv_attention: unsupported input (call qkv_attention_supported first)");
  return QkvAttentionFn::apply(qkv, heads, scale);
#else
  (void)qkv;
  (void)heads;
  (void)scale;
  throw std::invalid_argument("qkv_attention: needs a CUDA build");
#endif
}

}  // namespace vlatune::kernels
