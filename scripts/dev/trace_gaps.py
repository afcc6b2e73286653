# GPU idle gaps in a vlatune trace.json.gz: per traced step window, the total idle time, and the largest gaps with
# the kernels around them and the host scope open at the gap's start.
import gzip, json, sys, bisect, collections
path = sys.argv[1]
ev = json.load(gzip.open(path) if path.endswith(".gz") else open(path))["traceEvents"]
dev = sorted([e for e in ev if e.get("ph") == "X" and e.get("pid") == 2], key=lambda e: e["ts"])
host = sorted([e for e in ev if e.get("ph") == "X" and e.get("pid") == 1], key=lambda e: e["ts"])
print("device events", len(dev), "host scopes", len(host))
# merge device intervals
iv = []
for e in dev:
    s, t = e["ts"], e["ts"] + e.get("dur", 0)
    if iv and s <= iv[-1][1]:
        if t > iv[-1][1]: iv[-1][1] = t; iv[-1][3] = e
    else:
        iv.append([s, t, e, e])
gaps = [(iv[i + 1][0] - iv[i][1], iv[i][1], iv[i][3], iv[i + 1][2]) for i in range(len(iv) - 1)]
span = iv[-1][1] - iv[0][0]
busy = sum(t - s for s, t, _, _ in iv)
print(f"span {span/1e3:.1f} ms, busy {busy/1e3:.1f} ms, idle {(span-busy)/1e3:.1f} ms")
big = [g for g in gaps if g[0] > 2000]
print("gaps > 2 ms (between steps?):", [round(g[0] / 1e3, 1) for g in big])
small = [g for g in gaps if g[0] <= 2000]
print(f"idle inside steps (gaps <= 2 ms): {sum(g[0] for g in small)/1e3:.2f} ms in {len(small)} gaps")
starts = [h["ts"] for h in host]
def open_scopes(ts):
    out = []
    for h in host:
        if h["ts"] <= ts <= h["ts"] + h.get("dur", 0): out.append(h["name"])
    return out[-3:]
by_phase = collections.Counter()
by_pair = collections.Counter()
for g, ts, a, b in small:
    ph = (b.get("args") or {}).get("phase", "?")
    by_phase[ph] += g
    key = ((a.get("args") or {}).get("module", "?")[-50:], a["name"][:60], "->", (b.get("args") or {}).get("module", "?")[-50:], b["name"][:60])
    by_pair[key] += g
print("idle by phase of the next kernel (ms):", {k: round(v / 1e3, 2) for k, v in by_phase.items()})
print("top gap sites (total ms over traced steps):")
for k, v in by_pair.most_common(25):
    print(f"  {v/1e3:7.3f}  {k}")
print("largest single gaps:")
for g, ts, a, b in sorted(small, key=lambda x: -x[0])[:15]:
    print(f"  {g/1e3:7.3f} ms  after {a['name'][:50]} ({(a.get('args') or {}).get('module','?')[-40:]})  before {b['name'][:50]} ({(b.get('args') or {}).get('module','?')[-40:]}) host: {open_scopes(ts)}")
