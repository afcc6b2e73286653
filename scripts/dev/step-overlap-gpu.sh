#!/usr/bin/env bash
# vlatune beside the compiled PyTorch reference doing the same work, on one GPU in one call (the speed targets'
# pairs), with the step overlap A/B: for each pair in PAIRS, the reference, then `vlatune train` with the next step
# queued before the last is read (the default) and with --no-step-overlap, each STEPS steps at batch 32 with the
# first TIMING_WARMUP left out of the median; with REF_RUNS=2 the reference runs again after vlatune, and the ratio
# is taken against the median of its runs (the reference's speed has moved ~6% between calls, vlatune's < 1%). A
# table last.
#
#   bash scripts/pack-deps.sh; mkdir -p .ref && cp <pi05_torch_reference.py> .ref/
#   device run: command "PAIRS=fp8 TESTS='[gpu][train],[gpu][optimizer]' bash scripts/dev/step-overlap-gpu.sh",
#               carry [".deps", ".ref"]
# PAIRS (space-separated, default "fp8"): fp8, bf16, trimmed, as scripts/dev/pairs.sh sets them up (the FP8 recipe
# and the default one untrimmed on synthetic data, the FP8 recipe trimmed on short prompts; the reference alike).
# TESTS: a Catch2 spec of GPU test cases to build and run first (none by default). STEPS (40), TIMING_WARMUP (10),
# REF (1: run the reference), REF_RUNS (1 or 2), REF_STEPS (10, of which 3 warm up), AB (1: also the
# --no-step-overlap run).
# Output ($OUT, a few files: the device tool returns eight): table.md, pairs.json (every reference result and every
# vlatune run.json, by pair), tests.log. Logs and the build's stay in /tmp/step-overlap-logs (a failed run prints
# its tail).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
logs=/tmp/step-overlap-logs
rm -rf "$logs"
mkdir -p "$out" "$logs"
steps="${STEPS:-40}"
timing_warmup="${TIMING_WARMUP:-10}"
ref_runs="${REF_RUNS:-1}"
case "$ref_runs" in 1 | 2) ;; *) echo "REF_RUNS must be 1 or 2, got '$ref_runs'" >&2; exit 2 ;; esac
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
source scripts/dev/gpu-build.sh
gpu_build_tested "$logs" "$out" || exit 1
v=./build-gpu/cli/vlatune
echo "$(el) built"

source scripts/dev/pairs.sh
reference() {  # PAIR RUN
  local name="$1_reference_$2"
  PYTHONUNBUFFERED=1 python3 .ref/pi05_torch_reference.py "${pair_ref_flags[@]}" --steps "${REF_STEPS:-10}" --warmup 3 \
    --tag "$1" >"$logs/$name.log" 2>&1
  grep RESULT "$logs/$name.log" | tail -1 | sed 's/^RESULT //' >"$logs/$name.json"
  [ -s "$logs/$name.json" ] || tail -20 "$logs/$name.log"
  echo "$(el) $1 reference run $2: $(cat "$logs/$name.json")"
}
for pair in ${PAIRS:-fp8}; do
  pair_setup "$pair" "$logs" "$v" || exit $?
  [ "${REF:-1}" = 1 ] && reference "$pair" 1
  runs=(overlap)
  [ "${AB:-1}" = 1 ] && runs+=(read)
  for run in "${runs[@]}"; do
    flags=()
    [ "$run" = read ] && flags=(--no-step-overlap)
    rm -rf "/tmp/overlap-$pair-$run"
    timeout 300 $v train --config full --data "$pair_data" --recipe "$pair_recipe" --steps "$steps" --seed 0 \
      --timing-warmup "$timing_warmup" --out "/tmp/overlap-$pair-$run" --no-progress --log-every 10 --no-save \
      "${flags[@]}" >"$logs/${pair}_$run.log" 2>&1
    code=$?
    echo "$(el) $pair $run exit $code: $(tail -1 "$logs/${pair}_$run.log")"
    [ "$code" = 0 ] || tail -20 "$logs/${pair}_$run.log"
    cp "/tmp/overlap-$pair-$run/run.json" "$logs/${pair}_$run.json" 2>/dev/null
  done
  [ "${REF:-1}" = 1 ] && [ "$ref_runs" = 2 ] && reference "$pair" 2
done

python3 - "$logs" "$out" ${PAIRS:-fp8} <<'PY' | tee "$out/table.md"
import json, os, statistics, sys
logs, out, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(name):
    try: return json.load(open(os.path.join(logs, name)))
    except (OSError, ValueError): return None
every = {}
print("| pair | reference samples/s (GiB), per run | overlapped samples/s (GiB) | read one by one | overlap gain | vs reference (median of its runs) |")
print("|---|---|---|---|---|---|")
for p in pairs:
    refs = [r for r in (load(f"{p}_reference_{i}.json") for i in (1, 2)) if r and r.get("samples_per_s")]
    a, b = load(f"{p}_overlap.json"), load(f"{p}_read.json")
    every[p] = {"reference": refs, "overlap": a, "read": b}
    sps = lambda r: r.get("samples_per_s_median") if r else None
    f = lambda r: f"{sps(r):.2f} ({r.get('peak_gib') or 0:.2f})" if sps(r) else "n/a"
    ref_cell = " / ".join(f"{r['samples_per_s']:.2f}" for r in refs)
    ref_cell = f"{ref_cell} ({refs[0].get('peak_gib') or 0:.2f})" if refs else "n/a"
    ref_sps = statistics.median(r["samples_per_s"] for r in refs) if refs else None
    gain = f"{sps(a) / sps(b):.3f}x" if sps(a) and sps(b) else "n/a"
    vs = f"{sps(a) / ref_sps:.3f}x" if sps(a) and ref_sps else "n/a"
    print(f"| {p} | {ref_cell} | {f(a)} | {f(b)} | {gain} | {vs} |")
json.dump(every, open(os.path.join(out, "pairs.json"), "w"), indent=1)
PY
echo "$(el) done"
