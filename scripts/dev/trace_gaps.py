# GPU idle gaps in a vlatune trace.json.gz (`vlatune profile --trace-steps N`): the idle time over the traced window,
# split into gaps where the GPU waited for the host (the next kernel's launch call ended after the previous kernel
# ended: the host was behind) and gaps on the device side (the launch was queued in time), with the modules the
# waiting kernels belong to and the largest single gaps.
#   python3 scripts/dev/trace_gaps.py DIR/trace.json.gz
# Device events are the kernels, memsets and copies (cat kernel / gpu_memset / gpu_memcpy); host events the CUDA
# runtime and driver calls, matched to their kernels by the "correlation" argument both carry.
import collections
import gzip
import json
import sys

path = sys.argv[1]
ev = json.load(gzip.open(path) if path.endswith(".gz") else open(path))["traceEvents"]
DEVICE = ("kernel", "gpu_memset", "gpu_memcpy")
dev = sorted([e for e in ev if e.get("ph") == "X" and e.get("cat") in DEVICE], key=lambda e: e["ts"])
launch = {(e.get("args") or {}).get("correlation"): e
          for e in ev if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")}
steps = [e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep")]
if not dev:
    sys.exit("trace_gaps: no kernel, memset or copy events in " + path)
print(f"device events {len(dev)}, launch calls {len(launch)}, traced steps {len(steps)}")

# Merged busy intervals: [start, end, first event, last event].
iv = []
for e in dev:
    s, t = e["ts"], e["ts"] + e.get("dur", 0)
    if iv and s <= iv[-1][1]:
        if t > iv[-1][1]:
            iv[-1][1], iv[-1][3] = t, e
    else:
        iv.append([s, t, e, e])
span = iv[-1][1] - iv[0][0]
busy = sum(t - s for s, t, _, _ in iv)
print(f"span {span / 1e3:.1f} ms, busy {busy / 1e3:.1f} ms, idle {(span - busy) / 1e3:.2f} ms "
      f"(the last step may be cut where its host scope ended)")


def module(e):
    return (e.get("args") or {}).get("module", "?")


def phase(e):
    return (e.get("args") or {}).get("phase", "?")


host_bound = collections.Counter()
device_side = collections.Counter()
sizes = collections.Counter()
gaps = []
for i in range(len(iv) - 1):
    before, after = iv[i][3], iv[i + 1][2]
    gap = iv[i + 1][0] - iv[i][1]
    call = launch.get((after.get("args") or {}).get("correlation"))
    waited_for_host = call is not None and call["ts"] + call.get("dur", 0) > iv[i][1]
    key = (module(after)[-60:], phase(after))
    (host_bound if waited_for_host else device_side)[key] += gap
    sizes[min(int(gap) // 5 * 5, 50)] += 1
    gaps.append((gap, waited_for_host, before, after))
print(f"idle where the GPU waited for the host: {sum(host_bound.values()) / 1e3:.2f} ms; "
      f"device side (launch queued in time): {sum(device_side.values()) / 1e3:.2f} ms in {len(gaps)} gaps")
print("gap sizes (us, 5-us buckets, 50 = 50 and more): count", sorted(sizes.items()))
print("waited for the host, by the next kernel's module (ms):")
for (m, ph), v in host_bound.most_common(15):
    print(f"  {v / 1e3:7.3f}  {m} ({ph})")
print("device side, by the next kernel's module (ms):")
for (m, ph), v in device_side.most_common(10):
    print(f"  {v / 1e3:7.3f}  {m} ({ph})")
print("largest single gaps:")
for gap, host, a, b in sorted(gaps, key=lambda g: -g[0])[:15]:
    print(f"  {gap / 1e3:7.3f} ms {'host  ' if host else 'device'} after {a['name'][:40]} ({module(a)[-40:]}) "
          f"before {b['name'][:40]} ({module(b)[-40:]})")
