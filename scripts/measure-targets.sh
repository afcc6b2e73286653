#!/usr/bin/env bash
# Every single-GPU measurement the targets need, in one device call on `nvidia-h200-x2`: each GPU runs one
# vlatune-vs-reference pair (the comparisons stay on one GPU), then the gates and the plan validation.
#
#   GPU 0: GPU tests (--tests SPEC); reference compiled bf16; vlatune train bf16 (default recipe, no trimming); the H200
#          perf-gate baseline and one gate run against it.
#   GPU 1: reference compiled FP8; vlatune train with recipes/pi05_libero_h200_fp8.json; an FP8 profile (GEMM
#          share of the step); the FP8 numerics gate (bf16 vs FP8, same seed and data, 200 steps at batch 16 with
#          the peak learning rate reached after 20 steps, so that the loss curve moves; `check --numerics
#          --curve-loss-only`); the plan grid (--grid DIR: scripts/plan-grid.sh).
#
# From the development machine:
#   bash scripts/pack-deps.sh && mkdir -p .ref && cp /path/to/pi05_torch_reference.py .ref/   (the PyTorch reference, kept outside this repository)
#   device run (kind nvidia-h200-x2): command "bash scripts/measure-targets.sh --grid bench/grids/h200_57gib",
#   carry [".deps", ".ref"]
# Output: $OUT/{g0,g1}/ (gpu-check summaries, run.json files), $OUT/gate0 (the new baseline), $OUT/gate1 (check),
# $OUT/prof_fp8, $OUT/num_*.json + numerics.txt, $OUT/grid; the last lines summarize. With --pack, $OUT holds
# only measure-targets.tar.gz of all that (a remote runner may bring back only a few files).
#
# Options: --tests SPEC (Catch2 spec of the GPU tests; default "[gpu]"), --grid DIR, --train-steps N (default 14),
#          --fp8-recipe FILE, --pack, --only-gates (GPU 0: the perf gate only; GPU 1: the numerics gate and the grid),
#          --pairs-only (the two vlatune-vs-reference pairs and the GPU tests; no profile, gates or grid),
#          --no-build (reuse build-gpu/ from an earlier call on the same warm machine),
#          --bench-filter REGEX (GPU 0's microbenchmarks before its pair; default 'fp8_geglu_cast').
#
# Same work as the reference: vlatune's target runs do not trim the text padding. The recipes trained (the default
# recipe for bf16, --fp8-recipe for FP8) are copied into $OUT with "data.trim_text": false, because trimming counts
# only for the trimmed-prompt target (DEVELOPERS.md; with prompts of 20-199 real tokens padded to 200, trimming to
# the batch's longest rounded up to 16 cuts 8 positions in about one batch in four).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
tests="[gpu]"
grid=""
train_steps=14
fp8_recipe=recipes/pi05_libero_h200_fp8.json
only_gates=0
pairs_only=0
build=1
pack=0
bench_filter='fp8_geglu_cast'
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests="$2"; shift 2 ;;
    --grid) grid="$2"; shift 2 ;;
    --train-steps) train_steps="$2"; shift 2 ;;
    --fp8-recipe) fp8_recipe="$2"; shift 2 ;;
    --only-gates) only_gates=1; shift ;;
    --pairs-only) pairs_only=1; shift ;;
    --no-build) build=0; shift ;;
    --pack) pack=1; shift ;;
    --bench-filter) bench_filter="$2"; shift 2 ;;
    *) echo "measure-targets: unknown option '$1'" >&2; exit 4 ;;
  esac
done
t0=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - t0 )) s]"; }

if [ "$build" = 1 ]; then
  bash scripts/gpu-check.sh --build-only >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  echo "$(elapsed) built"
fi
v="$root/build-gpu/cli/vlatune"

# The same-work recipes: trimming off (see the header).
no_trim() {  # SRC (a recipe file, or "none" for the defaults) DEST
  python3 - "$1" "$2" <<'PY'
import json, sys
src, dest = sys.argv[1], sys.argv[2]
r = {"schema": "vlatune.recipe/1"} if src == "none" else json.load(open(src))
r.setdefault("data", {})["trim_text"] = False
json.dump(r, open(dest, "w"), indent=2)
PY
}
bf16_recipe="$out/bf16_no_trim.json"
no_trim none "$bf16_recipe"
fp8_same="$out/$(basename "$fp8_recipe" .json)_no_trim.json"
no_trim "$fp8_recipe" "$fp8_same"

gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  if [ "$only_gates" = 0 ]; then
    OUT="$out/g1" bash scripts/gpu-check.sh --no-build --skip-tests --bench-filter NONE_ --ref compiled-fp8 \
      --train-steps "$train_steps" --train-recipes "$fp8_same"
    [ "$pairs_only" = 1 ] && { echo "$(elapsed) GPU 1 done"; return; }
    echo "$(elapsed) FP8 profile"
    timeout 150 "$v" profile --config full --data synthetic --batch 32 --steps 2 --warmup 1 --timed-steps 3 \
      --ab-steps 0 --gemm-reps 0 --trace-steps 0 --recipe "$fp8_recipe" --out "$out/prof_fp8" 2>&1 | tail -5
  fi
  echo "$(elapsed) numerics: bf16 vs FP8, batch 16, 200 steps, seed 0, warm-up 20 steps to lr 5e-5"
  for run in bf16 fp8; do
    args=()
    [ "$run" = fp8 ] && args=(--recipe "$fp8_recipe")
    rm -rf "/tmp/num_$run"
    timeout 200 "$v" train --config full --data synthetic --batch 16 --steps 200 --warmup-steps 20 --seed 0 \
      --timing-warmup 0 "${args[@]}" --out "/tmp/num_$run" --no-progress --log-every 50 --no-save 2>&1 | tail -3
    cp "/tmp/num_$run/run.json" "$out/num_$run.json" 2>/dev/null
  done
  "$v" check --numerics --curve-loss-only --baseline "$out/num_bf16.json" --candidate "$out/num_fp8.json" \
    >"$out/numerics.txt" 2>&1
  echo "numerics gate exit $?"
  if [ -n "$grid" ]; then
    echo "$(elapsed) plan grid $grid"
    OUT="$out/grid" timeout 240 bash scripts/plan-grid.sh "$grid" --vlatune "$v"
  fi
  echo "$(elapsed) GPU 1 done"
}
gpu1 >"$out/gpu1.log" 2>&1 &
gpu1_pid=$!

{
  export CUDA_VISIBLE_DEVICES=0
  [ "$only_gates" = 1 ] ||
    OUT="$out/g0" bash scripts/gpu-check.sh --no-build --no-ctest --test-filter "$tests" \
      --bench-filter "$bench_filter" --bench-repetitions 3 --ref compiled --train-steps "$train_steps" \
      --train-recipes "$bf16_recipe"
  if [ "$pairs_only" = 0 ]; then
    echo "$(elapsed) perf gate: baseline, then a gate run against it"
    OUT="$out/gate0" bash scripts/perf-gate.sh --vlatune "$v" --no-baseline | tail -4
    cp "$out/gate0/pi05_full_bs32.json" reports/baselines/h200/ &&
      OUT="$out/gate1" bash scripts/perf-gate.sh --vlatune "$v" | tail -12
  fi
  echo "$(elapsed) GPU 0 done"
} >"$out/gpu0.log" 2>&1
wait "$gpu1_pid"

echo "== GPU 0"
tail -25 "$out/gpu0.log"
echo "== GPU 1"
tail -30 "$out/gpu1.log"
echo "== numerics"
tail -12 "$out/numerics.txt" 2>/dev/null
echo "$(elapsed) done"
if [ "$pack" = 1 ]; then
  tar czf /tmp/measure-targets.tar.gz --exclude='*trace*' -C "$out" . &&
    find "$out" -mindepth 1 -delete && mv /tmp/measure-targets.tar.gz "$out/"
fi
