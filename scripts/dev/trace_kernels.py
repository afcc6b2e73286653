# Kernel counts per module in a vlatune trace.json.gz: which modules launch the most kernels, where the GPU time
# goes by module and kernel, and which short kernels (launch-bound: each costs a ~2 us gap besides its own time)
# they are.
# Usage: trace_kernels.py TRACE [STEPS (the profile's --trace-steps, default 1)] [N (rows, default 40)]
import collections, gzip, json, re, sys
path = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
ev = json.load(gzip.open(path) if path.endswith(".gz") else open(path))["traceEvents"]
dev = [e for e in ev if e.get("ph") == "X" and e.get("pid") == 2]
fold = lambda m: re.sub(r"\.\d+(\.|$)", r".*\1", m or "?")
short = lambda n: re.sub(r"_ZN\d+|[0-9]+|I.*$", "", n)[:70]
count = collections.Counter()
tiny = collections.Counter()
tiny_us = collections.Counter()
for e in dev:
    a = e.get("args") or {}
    key = (fold(a.get("module")), a.get("phase", "?"))
    count[key] += 1
    if e.get("dur", 0) < 10:
        k = key + (short(e["name"]),)
        tiny[k] += 1
        tiny_us[k] += e.get("dur", 0)
print(f"{len(dev)} device events over {steps} traced step(s); kernels < 10 us: {sum(tiny.values())}")
print("kernels per step by module and phase:")
for (m, ph), c in count.most_common(top // 2):
    print(f"  {c / steps:8.1f}  {ph:9s} {m[-90:]}")
busy_us = collections.Counter()
for e in dev:
    a = e.get("args") or {}
    busy_us[(fold(a.get("module")), a.get("phase", "?"), short(e["name"]))] += e.get("dur", 0)
print("GPU time per step by module, phase and kernel (the largest):")
for (m, ph, n), us in busy_us.most_common(top):
    print(f"  {us / steps / 1e3:8.3f} ms  {ph:9s} {m[-60:]}  {n}")
print("short kernels (< 10 us) per step by module, phase and kernel:")
for (m, ph, n), c in tiny.most_common(top):
    print(f"  {c / steps:8.1f}  {tiny_us[(m, ph, n)] / c:5.1f} us  {ph:9s} {m[-60:]}  {n}")
