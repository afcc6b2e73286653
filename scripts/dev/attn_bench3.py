# Masked joint attention as two SDPA calls with key-padding biases broadcast over queries.
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_common import *  # noqa: E402,F401,F403 (shapes, timeit, the mask)
q0 = torch.randn(B, H, N, D, device=dev, dtype=dt)
k0 = torch.randn(B, 1, N, D, device=dev, dtype=dt); v0 = torch.randn(B, 1, N, D, device=dev, dtype=dt)
go = torch.randn(B, H, N, D, device=dev, dtype=dt)
neg = torch.finfo(dt).min
bias_p = torch.where(pvalid, 0.0, float("-inf")).to(dt)[:, None, None, :]   # [B,1,1,P]
bias_s = torch.where(valid, 0.0, float("-inf")).to(dt)[:, None, None, :]    # [B,1,1,N]
def ref(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
def split(q, k, v, expand=True, backend=None):
    bp = bias_p.expand(B, H, P, P) if expand else bias_p.expand(B, 1, P, P)
    bs = bias_s.expand(B, H, S, N) if expand else bias_s.expand(B, 1, S, N)
    op = F.scaled_dot_product_attention(q[:, :, :P], k[:, :, :P], v[:, :, :P], attn_mask=bp, scale=scale, enable_gqa=True)
    os_ = F.scaled_dot_product_attention(q[:, :, P:], k, v, attn_mask=bs, scale=scale, enable_gqa=True)
    return torch.cat([op, os_], 2)
def run(name, f):
    try:
        q = q0.clone().requires_grad_(); k = k0.clone().requires_grad_(); v = v0.clone().requires_grad_()
        qr = q0.clone().requires_grad_(); kr = k0.clone().requires_grad_(); vr = v0.clone().requires_grad_()
        o = f(q, k, v); o_ref = ref(qr, kr, vr)
        vm = valid[:, None, :, None]
        err = ((o - o_ref).float().abs() * vm).max().item()
        gv = go * vm
        o.backward(gv); o_ref.backward(gv)
        e = [(a.grad - b.grad).float().abs().max().item() for a, b in ((q, qr), (k, kr), (v, vr))]
        fw = timeit(lambda: f(q, k, v)); fb = timeit(lambda: f(q, k, v).backward(go))
        print(f"{name:45s} fwd {fw:7.3f} fwd+bwd {fb:7.3f} bwd {fb-fw:7.3f} | err out {err:.3g} dq {e[0]:.3g} dk {e[1]:.3g} dv {e[2]:.3g}", flush=True)
    except Exception as ex:
        print(f"{name} FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)
run("current: one call, bool mask", ref)
run("split, key-padding bias expanded H", lambda q, k, v: split(q, k, v, True))
run("split, key-padding bias expanded 1", lambda q, k, v: split(q, k, v, False))
def split_nomask_prefix_img(q, k, v):
    # upper bound: prefix call without any mask (wrong numerics, timing only)
    op = F.scaled_dot_product_attention(q[:, :, :P], k[:, :, :P], v[:, :, :P], scale=scale, enable_gqa=True)
    os_ = F.scaled_dot_product_attention(q[:, :, P:], k, v, attn_mask=bias_s.expand(B, H, S, N), scale=scale, enable_gqa=True)
    return torch.cat([op, os_], 2)
run("bound: prefix no mask (WRONG numerics)", split_nomask_prefix_img)
def fullbias(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(mask, 0.0, float("-inf")).to(dt), scale=scale, enable_gqa=True)
run("one call, materialized bf16 bias", fullbias)
