#!/usr/bin/env bash
# Measures the candidates of `vlatune plan --grid N --grid-dir DIR` on the GPU machine: trains each
# DIR/candidate_<i>.json for a few steps (full size, synthetic data, as scripts/gpu-check.sh does) into
# DIR/run_<i>/, then prints predicted vs measured samples/s and peak and how close the plan (candidate_0) is to
# the best measured candidate (`vlatune plan --compare-grid DIR`; goal: within 3%).
#
# On the development machine:
#   vlatune plan --profile profile.json --out recipe.json --grid 5 --grid-dir grid
#   device run: command "bash scripts/plan-grid.sh grid", carry [".deps", "grid"]  (builds build-gpu/ first)
#
# Options: --steps N (default 12), --timing-warmup N (default 4), --vlatune PATH (skip the build).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ $# -ge 1 ] || { echo "usage: plan-grid.sh GRID_DIR [--steps N] [--timing-warmup N] [--vlatune PATH]" >&2; exit 4; }
grid="$1"; shift
steps=12
timing_warmup=4
vlatune=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --timing-warmup) timing_warmup="$2"; shift 2 ;;
    --vlatune) vlatune="$2"; shift 2 ;;
    *) echo "plan-grid: unknown option '$1'" >&2; exit 4 ;;
  esac
done
[ -f "$grid/candidate_0.json" ] || { echo "plan-grid: no $grid/candidate_0.json (run vlatune plan --grid N --grid-dir $grid)" >&2; exit 4; }
out="${OUT:-$root/out}"
mkdir -p "$out"

if [ -z "$vlatune" ]; then
  prefix="$root/.deps/root/usr"
  [ -d "$prefix" ] || { echo "plan-grid: .deps missing: run scripts/pack-deps.sh here and carry .deps" >&2; exit 4; }
  python="$(command -v python3)"
  commit="${VLATUNE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLATUNE_PYTHON="$python" -DVLATUNE_CUDA=ON \
    -DVLATUNE_GIT_COMMIT="$commit" -DCMAKE_PREFIX_PATH="$prefix" >/tmp/cmake.log 2>&1 \
    || { tail -40 /tmp/cmake.log; exit 1; }
  ninja -C build-gpu -j "$(nproc)" vlatune >/tmp/build.log 2>&1 || { tail -60 /tmp/build.log; exit 1; }
  vlatune=./build-gpu/cli/vlatune
fi

status=0
for recipe in "$grid"/candidate_*.json; do
  i="${recipe##*candidate_}"; i="${i%.json}"
  run="$grid/run_$i"
  rm -rf "$run"
  echo "== candidate $i: $recipe"
  # The recipe sets the micro-batch; no --batch here, so the trainer compares its prediction too.
  "$vlatune" train --config full --data synthetic --recipe "$recipe" --steps "$steps" \
    --timing-warmup "$timing_warmup" --out "$run" --no-progress --log-every 4 --no-save 2>&1 | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "plan-grid: candidate $i failed (out of memory?)"; status=1; }
  rm -rf "$run/checkpoints" "$run/final"  # keep run.json and metrics.jsonl only
done

echo "== summary"
"$vlatune" plan --compare-grid "$grid" | tee "$out/plan_grid.txt"
cp -r "$grid" "$out/" 2>/dev/null
exit $status
