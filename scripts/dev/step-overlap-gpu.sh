#!/usr/bin/env bash
# Step overlap A/B on one GPU, beside the compiled PyTorch reference doing the same work, in one call: for each
# pair in PAIRS, the reference, then `vlatune train` with the next step queued before the last is read (the
# default) and with --no-step-overlap, each STEPS steps at batch 32 with the first TIMING_WARMUP left out of the
# median. A table last.
#
#   bash scripts/pack-deps.sh; mkdir -p .ref && cp <pi05_torch_reference.py> .ref/
#   device run: command "PAIRS=fp8 TESTS='[gpu][train],[gpu][optimizer]' bash scripts/dev/step-overlap-gpu.sh",
#               carry [".deps", ".ref"]
# PAIRS (space-separated, default "fp8"): fp8, bf16, trimmed, as scripts/dev/pairs.sh sets them up (the FP8 recipe
# and the default one untrimmed on synthetic data, the FP8 recipe trimmed on short prompts; the reference alike).
# TESTS: a Catch2 spec of GPU test cases to build and run first (none by default). STEPS (40), TIMING_WARMUP (10),
# REF (1: run the reference), AB (1: also the --no-step-overlap run).
# Output: $OUT/<pair>_{reference,overlap,read}.{log,json}, $OUT/tests.log, $OUT/table.md.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
steps="${STEPS:-40}"
timing_warmup="${TIMING_WARMUP:-10}"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
source scripts/dev/gpu-build.sh
gpu_build_tested "$out" "$out" || exit 1
v=./build-gpu/cli/vlatune
echo "$(el) built"

source scripts/dev/pairs.sh
for pair in ${PAIRS:-fp8}; do
  pair_setup "$pair" "$out" "$v" || exit $?
  if [ "${REF:-1}" = 1 ]; then
    PYTHONUNBUFFERED=1 python3 .ref/pi05_torch_reference.py "${pair_ref_flags[@]}" --steps 10 --warmup 3 --tag "$pair" \
      >"$out/${pair}_reference.log" 2>&1
    grep RESULT "$out/${pair}_reference.log" | tail -1 | sed 's/^RESULT //' >"$out/${pair}_reference.json"
    echo "$(el) $pair reference: $(cat "$out/${pair}_reference.json")"
  fi
  runs=(overlap)
  [ "${AB:-1}" = 1 ] && runs+=(read)
  for run in "${runs[@]}"; do
    flags=()
    [ "$run" = read ] && flags=(--no-step-overlap)
    rm -rf "/tmp/overlap-$pair-$run"
    timeout 300 $v train --config full --data "$pair_data" --recipe "$pair_recipe" --steps "$steps" --seed 0 \
      --timing-warmup "$timing_warmup" --out "/tmp/overlap-$pair-$run" --no-progress --log-every 10 --no-save \
      "${flags[@]}" >"$out/${pair}_$run.log" 2>&1
    echo "$(el) $pair $run exit $?: $(tail -1 "$out/${pair}_$run.log")"
    cp "/tmp/overlap-$pair-$run/run.json" "$out/${pair}_$run.json" 2>/dev/null
  done
done

python3 - "$out" ${PAIRS:-fp8} <<'PY' | tee "$out/table.md"
import json, os, sys
out, pairs = sys.argv[1], sys.argv[2:]
def load(name):
    try: return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError): return None
print("| pair | reference samples/s (GiB) | overlapped samples/s (GiB) | read one by one | overlap gain | vs reference |")
print("|---|---|---|---|---|---|")
for p in pairs:
    ref, a, b = load(f"{p}_reference.json"), load(f"{p}_overlap.json"), load(f"{p}_read.json")
    sps = lambda r: r.get("samples_per_s_median") if r else None
    f = lambda r, key="samples_per_s_median": f"{r[key]:.2f} ({r.get('peak_gib') or 0:.2f})" if r and r.get(key) else "n/a"
    ref_sps = ref.get("samples_per_s") if ref else None
    gain = f"{sps(a) / sps(b):.3f}x" if sps(a) and sps(b) else "n/a"
    vs = f"{sps(a) / ref_sps:.3f}x" if sps(a) and ref_sps else "n/a"
    print(f"| {p} | {f(ref, 'samples_per_s')} | {f(a)} | {f(b)} | {gain} | {vs} |")
PY
echo "$(el) done"
