# Attention variants on Pi0.5's shapes (H200): fwd and fwd+bwd ms, CUDA events, median of 20.
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_common import *  # noqa: E402,F401,F403 (shapes, timeit, the mask)

q = torch.randn(B, H, N, D, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(B, 1, N, D, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(B, 1, N, D, device=dev, dtype=dt, requires_grad=True)
go = torch.randn(B, H, N, D, device=dev, dtype=dt)
res = {}
def run(name, f):
    try:
        fw = timeit(lambda: f())
        def fb():
            o = f(); o.backward(go if o.shape == go.shape else torch.ones_like(o))
        fbt = timeit(fb)
        res[name] = (fw, fbt); print(f"{name:50s} fwd {fw:7.3f} ms  fwd+bwd {fbt:7.3f} ms  bwd {fbt-fw:7.3f}", flush=True)
    except Exception as e:
        print(f"{name:50s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

run("joint sdpa bool mask (current, default backend)", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True))
for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    def f(be=be):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    run(f"joint sdpa bool mask {be.name}", f)
for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    def f(be=be):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    run(f"joint sdpa NO mask {be.name}", f)
# BTHD layout (q transposed view), no mask, cudnn
qt = torch.randn(B, N, H, D, device=dev, dtype=dt, requires_grad=True)
kt = torch.randn(B, N, 1, D, device=dev, dtype=dt, requires_grad=True)
vt = torch.randn(B, N, 1, D, device=dev, dtype=dt, requires_grad=True)
def f():
    return F.scaled_dot_product_attention(qt.transpose(1,2), kt.transpose(1,2), vt.transpose(1,2), attn_mask=mask, scale=scale, enable_gqa=True)
run("joint sdpa bool mask BTHD layout", f)

# Flash varlen: prefix queries vs packed valid prefix keys; suffix queries vs packed valid prefix + suffix keys.
Lp = pvalid.sum(1).to(torch.int32)            # valid prefix keys per sample
cu_q_p = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * P
cu_q_s = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * S
cu_k_p = torch.cat([torch.zeros(1, device=dev, dtype=torch.int32), Lp.cumsum(0).to(torch.int32)])
cu_k_s = torch.cat([torch.zeros(1, device=dev, dtype=torch.int32), (Lp + S).cumsum(0).to(torch.int32)])
keys_p = valid.clone(); keys_p[:, P:] = False   # which of the N keys the prefix sees
idx_p = keys_p.reshape(-1).nonzero().squeeze(1); idx_s = valid.reshape(-1).nonzero().squeeze(1)
qf = torch.randn(B, N, H, D, device=dev, dtype=dt)
kf = torch.randn(B * N, 1, D, device=dev, dtype=dt); vf = torch.randn(B * N, 1, D, device=dev, dtype=dt)
gof = torch.randn(B, N, H, D, device=dev, dtype=dt)
def flash_fwd():
    qp = qf[:, :P].reshape(B * P, H, D); qs = qf[:, P:].reshape(B * S, H, D)
    kp, vp = kf.index_select(0, idx_p), vf.index_select(0, idx_p)
    ks, vs = kf.index_select(0, idx_s), vf.index_select(0, idx_s)
    op = torch.ops.aten._flash_attention_forward(qp, kp, vp, cu_q_p, cu_k_p, P, N, 0.0, False, False, scale=scale)
    os_ = torch.ops.aten._flash_attention_forward(qs, ks, vs, cu_q_s, cu_k_s, S, N, 0.0, False, False, scale=scale)
    return (qp, kp, vp, op), (qs, ks, vs, os_)
def flash_fb():
    (qp, kp, vp, op), (qs, ks, vs, os_) = flash_fwd()
    gp = gof[:, :P].reshape(B * P, H, D); gs = gof[:, P:].reshape(B * S, H, D)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(gp, qp, kp, vp, op[0], op[1], cu_q_p, cu_k_p, P, N, 0.0, False, op[2], op[3], scale=scale)
    dq2, dk2, dv2 = torch.ops.aten._flash_attention_backward(gs, qs, ks, vs, os_[0], os_[1], cu_q_s, cu_k_s, S, N, 0.0, False, os_[2], os_[3], scale=scale)
    dkf = torch.zeros_like(kf); dkf.index_add_(0, idx_p, dk); dkf.index_add_(0, idx_s, dk2)
    dvf = torch.zeros_like(vf); dvf.index_add_(0, idx_p, dv); dvf.index_add_(0, idx_s, dv2)
    dqf = torch.cat([dq.view(B, P, H, D), dq2.view(B, S, H, D)], 1)
try:
    fw = timeit(flash_fwd); fbt = timeit(flash_fb)
    print(f"{'joint flash varlen (packed kv, 2 calls)':50s} fwd {fw:7.3f} ms  fwd+bwd {fbt:7.3f} ms  bwd {fbt-fw:7.3f}", flush=True)
except Exception as e:
    print("flash varlen FAILED", type(e).__name__, str(e)[:400])
# correctness of flash varlen vs masked sdpa (valid query rows)
try:
    (qp, kp, vp, op), (qs, ks, vs, os_) = flash_fwd()
    o_var = torch.cat([op[0].view(B, P, H, D), os_[0].view(B, S, H, D)], 1)
    o_ref = F.scaled_dot_product_attention(qf.transpose(1, 2), kf.view(B, N, 1, D).transpose(1, 2), vf.view(B, N, 1, D).transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)
    err = (o_var - o_ref).float().abs()[valid].max().item()
    print("flash varlen max abs err on valid rows vs masked sdpa:", err)
except Exception as e:
    print("check FAILED", type(e).__name__, str(e)[:300])

# SigLIP: [64 images, 16 heads, 256 tokens, d 72], no mask
Bi, Hi, Ti, Di = 64, 16, 256, 72
qs_ = torch.randn(Bi, Hi, Ti, Di, device=dev, dtype=dt, requires_grad=True)
ks_ = torch.randn(Bi, Hi, Ti, Di, device=dev, dtype=dt, requires_grad=True)
vs_ = torch.randn(Bi, Hi, Ti, Di, device=dev, dtype=dt, requires_grad=True)
go = torch.randn(Bi, Hi, Ti, Di, device=dev, dtype=dt)
run("siglip sdpa default", lambda: F.scaled_dot_product_attention(qs_, ks_, vs_))
for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    def f(be=be):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(qs_, ks_, vs_)
    run(f"siglip sdpa {be.name}", f)
