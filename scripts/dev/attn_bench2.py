# cuDNN varlen attention (packed K/V, uniform queries) vs masked SDPA on the joint Pi0.5 shapes.
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_common import *  # noqa: E402,F401,F403 (shapes, timeit, the mask)
Lp = pvalid.sum(1).to(torch.int32)
i32 = torch.int32
cu_q_p = torch.arange(0, B + 1, device=dev, dtype=i32) * P
cu_q_s = torch.arange(0, B + 1, device=dev, dtype=i32) * S
cu_k_p = torch.cat([torch.zeros(1, device=dev, dtype=i32), Lp.cumsum(0).to(i32)])
cu_k_s = torch.cat([torch.zeros(1, device=dev, dtype=i32), (Lp + S).cumsum(0).to(i32)])
keys_p = valid.clone(); keys_p[:, P:] = False
idx_p = keys_p.reshape(-1).nonzero().squeeze(1); idx_s = valid.reshape(-1).nonzero().squeeze(1)
q0 = torch.randn(B, N, H, D, device=dev, dtype=dt)
k0 = torch.randn(B, N, 1, D, device=dev, dtype=dt); v0 = torch.randn(B, N, 1, D, device=dev, dtype=dt)
go = torch.randn(B, N, H, D, device=dev, dtype=dt)

def ref(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)

def varlen(q, k, v, layout):
    kf, vf = k.reshape(B * N, 1, D), v.reshape(B * N, 1, D)
    qp = q[:, :P].reshape(B * P, H, D); qs = q[:, P:].reshape(B * S, H, D)
    kp, vp, ks, vs = kf[idx_p], vf[idx_p], kf[idx_s], vf[idx_s]
    def call(qq, kk, vv, cq, ck, mq, mk):
        if layout == "thd":
            return torch.ops.aten._cudnn_attention_forward(qq, kk, vv, None, cq, ck, mq, mk, True, 0.0, False, False, scale=scale)[0]
        # [1, H, T, D] strided views of THD
        o = torch.ops.aten._cudnn_attention_forward(qq.transpose(0, 1).unsqueeze(0), kk.transpose(0, 1).unsqueeze(0), vv.transpose(0, 1).unsqueeze(0), None, cq, ck, mq, mk, True, 0.0, False, False, scale=scale)[0]
        return o.squeeze(0).transpose(0, 1)
    op = call(qp, kp, vp, cu_q_p, cu_k_p, P, N)
    os_ = call(qs, ks, vs, cu_q_s, cu_k_s, S, N)
    return torch.cat([op.reshape(B, P, H, D), os_.reshape(B, S, H, D)], 1)

for layout in ("thd", "bhtd-view"):
    try:
        q = q0.clone().requires_grad_(); k = k0.clone().requires_grad_(); v = v0.clone().requires_grad_()
        o = varlen(q, k, v, layout)
        qr = q0.clone().requires_grad_(); kr = k0.clone().requires_grad_(); vr = v0.clone().requires_grad_()
        o_ref = ref(qr, kr, vr)
        err = (o - o_ref).float().abs()[valid].max().item()
        gv = go * valid[:, :, None, None]  # pad rows dead: zero upstream grad
        o.backward(gv); o_ref.backward(gv)
        eq = (q.grad - qr.grad).float().abs().max().item(); ek = (k.grad - kr.grad).float().abs().max().item(); ev = (v.grad - vr.grad).float().abs().max().item()
        print(f"cudnn varlen {layout}: out err {err:.4g}, dq {eq:.4g} dk {ek:.4g} dv {ev:.4g} (|dk| max {kr.grad.abs().max().item():.3g})", flush=True)
        q = q0.clone().requires_grad_(); k = k0.clone().requires_grad_(); v = v0.clone().requires_grad_()
        fw = timeit(lambda: varlen(q, k, v, layout))
        fb = timeit(lambda: varlen(q, k, v, layout).backward(go))
        print(f"cudnn varlen {layout:10s} fwd {fw:7.3f} ms  fwd+bwd {fb:7.3f} ms  bwd {fb-fw:7.3f}", flush=True)
    except Exception as e:
        print(f"cudnn varlen {layout} FAILED {type(e).__name__}: {str(e)[:500]}", flush=True)
q = q0.clone().requires_grad_(); k = k0.clone().requires_grad_(); v = v0.clone().requires_grad_()
fw = timeit(lambda: ref(q, k, v)); fb = timeit(lambda: ref(q, k, v).backward(go))
print(f"masked sdpa (BTHD views) fwd {fw:7.3f} ms  fwd+bwd {fb:7.3f} ms  bwd {fb-fw:7.3f}", flush=True)
# suffix-only (last layer, prefix queries skipped)
def varlen_s(q, k, v):
    kf, vf = k.reshape(B * N, 1, D), v.reshape(B * N, 1, D)
    return torch.ops.aten._cudnn_attention_forward(q.reshape(B * S, H, D), kf[idx_s], vf[idx_s], None, cu_q_s, cu_k_s, S, N, True, 0.0, False, False, scale=scale)[0]
try:
    qs = torch.randn(B, S, H, D, device=dev, dtype=dt, requires_grad=True)
    fw = timeit(lambda: varlen_s(qs, k, v)); fb = timeit(lambda: varlen_s(qs, k, v).backward(go[:, P:].reshape(B * S, H, D)))
    print(f"suffix-only cudnn varlen fwd {fw:7.3f} ms  fwd+bwd {fb:7.3f}", flush=True)
    ms = mask[:, :, P:]
    fw = timeit(lambda: F.scaled_dot_product_attention(qs.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=ms, scale=scale, enable_gqa=True))
    print(f"suffix-only masked sdpa fwd {fw:7.3f} ms", flush=True)
except Exception as e:
    print("suffix-only FAILED", type(e).__name__, str(e)[:300])
