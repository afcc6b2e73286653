#!/usr/bin/env bash
# A/B of two recipes on one GPU, in one call: vlatune built once, both recipes trained alternately ROUNDS times on
# synthetic data (full size), a table of median samples/s with each recipe's prediction; optionally the second
# recipe's 200-step loss curve gated against a baseline run.json (`vlatune check --numerics --curve-loss-only`).
#
#   device: command "bash scripts/dev/recipe-ab-gpu.sh A.json B.json", carry [".deps", ".ref"] (recipes under .ref/)
#
# ROUNDS (2), STEPS (25), TIMING_WARMUP (8), MAX_MEMORY (GiB, none by default: both runs under `--max-memory`);
# TESTS: a Catch2 spec of GPU test cases to run first; GATE_STEPS (0; N > 0: B trains N steps, peak learning rate
# after 20, and is gated against GATE_BASELINE, a run.json of the same command with the baseline recipe).
# Output ($OUT): table.md, runs.txt, tests.log, numerics.txt, gate_run.json; logs in /tmp/recipe-ab-logs.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
[ $# = 2 ] && [ -f "$1" ] && [ -f "$2" ] || { echo "usage: $0 A.json B.json (recipe files)" >&2; exit 2; }
if [ "${GATE_STEPS:-0}" -gt 0 ] && [ ! -f "${GATE_BASELINE:-}" ]; then
  echo "GATE_STEPS needs GATE_BASELINE (a baseline run.json)" >&2
  exit 2
fi
recipes=("$1" "$2")
out="${OUT:-$root/out}"
logs=/tmp/recipe-ab-logs
rm -rf "$logs"
mkdir -p "$out" "$logs"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
source scripts/dev/gpu-build.sh
gpu_build_tested "$logs" "$out" || exit 1
v=./build-gpu/cli/vlatune
echo "$(el) built"
cap=()
[ -n "${MAX_MEMORY:-}" ] && cap=(--max-memory "$MAX_MEMORY")

for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in 0 1; do
    name="$side-$round"
    rm -rf "/tmp/rab-$name"
    timeout 300 $v train --config full --data synthetic --recipe "${recipes[$side]}" --steps "${STEPS:-25}" --seed 0 \
      --timing-warmup "${TIMING_WARMUP:-8}" "${cap[@]}" --out "/tmp/rab-$name" --no-progress --no-save \
      --log-every "${STEPS:-25}" >"$logs/$name.log" 2>&1
    echo "$(el) $(basename "${recipes[$side]}") round $round: $(grep '^done' "$logs/$name.log" | sed 's/;.*//')" |
      tee -a "$out/runs.txt"
    cp "/tmp/rab-$name/run.json" "$logs/$name.json" 2>/dev/null
  done
done

python3 - "$logs" "${recipes[@]}" <<'PY' | tee "$out/table.md"
import glob, json, os, statistics, sys
logs, recipes = sys.argv[1], sys.argv[2:]
print("| recipe | samples/s per round | median | predicted | prediction error | peak GiB |")
print("|---|---|---|---|---|---|")
med = []
for side, path in enumerate(recipes):
    runs = []
    for f in sorted(glob.glob(os.path.join(logs, f"{side}-*.json"))):
        try: runs.append(json.load(open(f)))
        except (OSError, ValueError): pass
    sps = [r["samples_per_s_median"] for r in runs if "samples_per_s_median" in r]
    m = statistics.median(sps) if sps else None
    med.append(m)
    pred = json.load(open(path)).get("predicted", {}).get("samples_per_s")
    err = f"{100 * (pred / m - 1):+.1f}%" if pred and m else "n/a"
    peak = max((r.get("peak_gib", 0) for r in runs), default=0)
    print(f"| {os.path.basename(path)} | {' / '.join(f'{x:.2f}' for x in sps) or 'n/a'} | "
          f"{f'{m:.2f}' if m else 'n/a'} | {f'{pred:.2f}' if pred else 'n/a'} | {err} | {peak:.2f} |")
if all(med): print(f"\n{os.path.basename(recipes[1])} / {os.path.basename(recipes[0])}: {med[1] / med[0]:.4f}x")
PY

if [ "${GATE_STEPS:-0}" -gt 0 ]; then
  rm -rf /tmp/rab-gate
  timeout 400 $v train --config full --data synthetic --recipe "${recipes[1]}" --steps "$GATE_STEPS" --warmup-steps 20 \
    --seed 0 --timing-warmup 3 "${cap[@]}" --out /tmp/rab-gate --no-progress --log-every 50 --no-save \
    >"$logs/gate.log" 2>&1
  echo "$(el) gate run exit $?: $(tail -1 "$logs/gate.log")"
  cp /tmp/rab-gate/run.json "$out/gate_run.json" 2>/dev/null
  $v check --numerics --curve-loss-only --baseline "$GATE_BASELINE" --candidate /tmp/rab-gate/run.json \
    >"$out/numerics.txt" 2>&1
  echo "numerics gate exit $?"
  tail -5 "$out/numerics.txt"
fi
echo "$(el) done"
