#!/usr/bin/env bash
# Full fine-tuning in 22 GiB: bf16 AdamW against 8-bit AdamW (optimizer.state_dtype "int8-blockwise") on the full
# config at global batch 32 (micro-batch 4 x grad_accum 8, SigLIP and decoder layers recomputed), each under
# --max-memory equal to its budget (bf16: 30 GiB, as its parameters, gradients and moments alone take 25; 8-bit:
# 22); peak memory and samples/s from run.json; the numerics gate of the FP8 work (scripts/measure-targets.sh:
# 200 steps, synthetic data, seed 0, peak lr after 20 steps, `vlatune check --numerics --curve-loss-only`: loss
# Pearson >= 0.999, mean relative error <= 1%) on the two runs, which start from the same weights and see the
# same batches. Also the GPU tests of the 8-bit kernel and the memory cap. Two GPUs visible (kind
# nvidia-h200-x2, ~6 min): the two runs go side by side; one GPU: one after the other (~9 min).
#
#   bash scripts/pack-deps.sh
#   device run (kind nvidia-h200-x2): command "bash scripts/dev/memory-gpu.sh", carry [".deps"]
# Output: $OUT/{bf16,int8}.json (run.json), $OUT/*_metrics.jsonl, $OUT/numerics.txt, $OUT/*.log; a table last.
# Options (environment): STEPS (default 200), MICRO (4), BUDGET_BF16 (30), BUDGET_INT8 (22), ARCHS (9.0),
# STATES ("int8 bf16": which runs this call makes; one GPU and a 10-minute call: STATES=int8, then STATES=bf16 in a
# second call on the same machine, which gates against the first's run kept in /tmp), TESTS (1: the GPU tests).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
steps="${STEPS:-200}"
micro="${MICRO:-4}"
accum=$((32 / micro))
budget_bf16="${BUDGET_BF16:-30}"
budget_int8="${BUDGET_INT8:-22}"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
source scripts/dev/gpu-build.sh
gpu_build "$out" vlatune vlatune_tests_torch || exit 1
v=./build-gpu/cli/vlatune
echo "$(el) built"; $v --version

if [ "${TESTS:-1}" = 1 ]; then
  ./build-gpu/tests/vlatune_tests_torch "[int8],[memory],[environment]" 2>&1 | tail -4 | tee "$out/tests_gpu.log"
  echo "$(el) GPU tests"
fi

mkdir -p /tmp/memory-recipes
for state in bf16 int8; do
  python3 - "$state" "$micro" "$accum" >"/tmp/memory-recipes/$state.json" <<'PY'
import json, sys
state, micro, accum = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = {"schema": "vlatune.recipe/1", "batch": {"micro_batch": micro, "grad_accum": accum},
     "recompute": {"modules": [
         "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*",
         "paligemma_with_expert.paligemma.model.language_model.layers.*"]}}
if state == "int8":
    r["optimizer"] = {"state_dtype": "int8-blockwise"}
print(json.dumps(r, indent=2))
PY
done

train() {  # STATE BUDGET GPU
  local state=$1 budget=$2
  rm -rf "/tmp/memory-$state"
  CUDA_VISIBLE_DEVICES=$3 timeout 330 $v train --config full --data synthetic --recipe "/tmp/memory-recipes/$state.json" \
    --steps "$steps" --warmup-steps 20 --seed 0 --timing-warmup 3 --max-memory "$budget" --out "/tmp/memory-$state" \
    --no-progress --log-every 25 --no-save >"$out/$state.log" 2>&1
  echo "$state exit $?" >>"$out/$state.log"
}
states="${STATES:-int8 bf16}"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ "$states" = "int8 bf16" ]; then
  train bf16 "$budget_bf16" 0 &
  train int8 "$budget_int8" 1
  wait
else
  for state in $states; do
    budget="$budget_bf16"; [ "$state" = int8 ] && budget="$budget_int8"
    train "$state" "$budget" 0
  done
fi
for state in bf16 int8; do  # this call's runs, or an earlier call's on the same machine
  cp "/tmp/memory-$state/run.json" "$out/$state.json" 2>/dev/null
  cp "/tmp/memory-$state/metrics.jsonl" "$out/${state}_metrics.jsonl" 2>/dev/null
done
echo "$(el) trained"; tail -3 "$out"/bf16.log "$out"/int8.log 2>/dev/null
$v check --numerics --curve-loss-only --baseline "$out/bf16.json" --candidate "$out/int8.json" >"$out/numerics.txt" 2>&1
gate=$?
cat "$out/numerics.txt"

python3 - "$out" "$micro" "$accum" "$budget_bf16" "$budget_int8" "$gate" <<'PY'
import json, os, sys
out, micro, accum, b_bf16, b_int8, gate = sys.argv[1:]
print(f"\n| AdamW state | micro-batch x accum | recompute | --max-memory GiB | peak GiB | samples/s (median) | steps |")
print("|---|---|---|---|---|---|---|")
for state, budget in (("bf16", b_bf16), ("int8", b_int8)):
    path = os.path.join(out, f"{state}.json")
    if not os.path.exists(path):
        print(f"| {state} | {micro} x {accum} | SigLIP + decoder layers | {budget} | failed (see {state}.log) | | |")
        continue
    r = json.load(open(path))
    peak = r.get("peak_gib") or float("nan")
    print(f"| {'int8-blockwise' if state == 'int8' else 'bf16'} | {micro} x {accum} | SigLIP + decoder layers | "
          f"{budget} | {peak:.2f} | {r.get('samples_per_s_median', 0):.2f} | {r.get('steps')} |")
print(f"numerics gate (loss Pearson >= 0.999, mean rel. error <= 1%): exit {gate} "
      f"({'pass' if gate == '0' else 'FAIL'}); details: numerics.txt")
PY
echo "$(el) done"
