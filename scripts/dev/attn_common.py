# Shared setup of the attention measurements: Pi0.5's joint shapes at batch 32, a timer, and the model's mask over
# prompts of 20-199 real tokens padded to 200 (model/pi05.cpp step 4). Seeded: every script draws the same mask.
import math
import statistics

import torch

torch.manual_seed(0)
dev = "cuda"
dt = torch.bfloat16
B, H, D, P, S, IMG = 32, 8, 256, 712, 50, 512
N = P + S
scale = 1 / math.sqrt(D)


def timeit(fn, reps=20, warm=3):
    """Median ms of `reps` runs of fn, CUDA events, after `warm` untimed runs."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


ntok = torch.randint(20, 200, (B,), device=dev)
tok_valid = torch.arange(200, device=dev)[None] < ntok[:, None]
pvalid = torch.cat([torch.ones(B, IMG, dtype=torch.bool, device=dev), tok_valid], 1)  # valid prefix keys [B, P]
valid = torch.cat([pvalid, torch.ones(B, S, dtype=torch.bool, device=dev)], 1)  # [B, N]
block = torch.cat([torch.zeros(P, dtype=torch.long, device=dev), torch.ones(S, dtype=torch.long, device=dev)])
allowed = block[None] <= block[:, None]
eye = torch.eye(N, dtype=torch.bool, device=dev)
mask = ((allowed[None] & valid[:, None]) | eye)[:, None]  # [B, 1, N, N]: query i may attend key j
