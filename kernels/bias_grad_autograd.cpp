// bias_grad's torch entry point (contract: fused_ops.h): bias_grad.cu's kernels on CUDA bf16/fp32 gradients of a
// supported width, ATen's sum and a cast elsewhere. No autograd of its own (it is part of Linears' backwards).
#include <ATen/ATen.h>

#include "kernels/bias_grad.h"
#include "kernels/fused_ops.h"
#include "kernels/op_support.h"

namespace vlatune::kernels {

at::Tensor bias_grad(const at::Tensor& g_in, at::ScalarType dtype) {
  const int64_t n = g_in.size(-1);
  const at::Tensor g = g_in.reshape({-1, n});
#ifdef VLATUNE_HAVE_CUDA
  const bool typed = g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kFloat;
  if (g.is_cuda() && typed && g.size(0) > 0 && g.is_contiguous() && aligned16(g) &&
      bias_grad_supported(act_dtype(g), n)) {
    const c10::cuda::CUDAGuard guard(g.device());
    at::Tensor partials = at::empty({bias_grad_chunks(g.size(0), n), n}, g.options().dtype(at::kFloat));
    at::Tensor out = at::empty({n}, g.options());
    BiasGradParams p;
    p.dtype = act_dtype(g);
    p.rows = g.size(0);
    p.cols = n;
    p.g = g.const_data_ptr();
    p.partials = partials.data_ptr<float>();
    p.out = out.data_ptr();
    launch_bias_grad(p, stream_of(g));
    return out.to(dtype);
  }
#endif
  return g.sum(0).to(dtype);
}

}  // namespace vlatune::kernels
