#!/usr/bin/env bash
# The performance gate on the GPU machine, in one device call: build `vlatune`, train Pi0.5 (full size,
# synthetic data, batch 32, the baseline's recipe) for a few dozen steps, and `vlatune check` the run against
# reports/baselines/h200/NAME.json. Prints the verdict and exits with check's code (0 pass, 1 regression,
# 2 numerics, 3 incomparable, 4 bad input / no baseline). run.json and the check output land in $OUT.
#
# From the development machine (see reports/baselines/README.md):
#   bash scripts/pack-deps.sh
#   device run: command "bash scripts/perf-gate.sh", carry [".deps"]
#
# Options:
#   --name NAME        baseline name (default pi05_full_bs32): reports/baselines/h200/NAME.json, trained with
#                      reports/baselines/h200/NAME.recipe.json
#   --steps N          optimizer steps (default 40; the first 3 are warm-up, >= 9 must remain for the U test)
#   --update-baseline  when the run is a significant improvement, $OUT/NAME.json is the new baseline to commit
#   --no-baseline      only train and write $OUT/NAME.json (to create the first baseline)
#   --vlatune PATH     use this binary (skip the build; e.g. after gpu-check.sh --build-only in the same call)
#   -- ARGS            further arguments for `vlatune check` (e.g. -- --threshold 5)
#
# Environment: VLATUNE_COMMIT names the commit (else git's HEAD: a device copy's git metadata can lag the tree).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
name="pi05_full_bs32"
steps=40
update=0
no_baseline=0
vlatune=""
check_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --update-baseline) update=1; shift ;;
    --no-baseline) no_baseline=1; shift ;;
    --vlatune) vlatune="$2"; shift 2 ;;
    --) shift; check_args=("$@"); break ;;
    *) echo "perf-gate: unknown option '$1'" >&2; exit 4 ;;
  esac
done
baseline="$root/reports/baselines/h200/$name.json"
recipe="$root/reports/baselines/h200/$name.recipe.json"
[ -f "$recipe" ] || { echo "perf-gate: $recipe missing (the recipe the baseline was trained with)" >&2; exit 4; }
if [ "$no_baseline" = 0 ] && [ ! -f "$baseline" ]; then
  echo "perf-gate: no baseline $baseline yet: run with --no-baseline and commit \$OUT/$name.json there" >&2
  exit 4
fi

echo "== environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader || true

if [ -z "$vlatune" ]; then
  echo "== build (build-gpu/, target vlatune)"
  python="$(command -v python3)"
  prefix="$root/.deps/root/usr"
  [ -d "$prefix" ] || { echo "perf-gate: .deps missing: run scripts/pack-deps.sh here and carry .deps" >&2; exit 4; }
  commit="${VLATUNE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLATUNE_PYTHON="$python" -DVLATUNE_CUDA=ON \
    -DVLATUNE_GIT_COMMIT="$commit" -DCMAKE_PREFIX_PATH="$prefix" >/tmp/perf-cmake.log 2>&1 \
    || { tail -40 /tmp/perf-cmake.log; exit 4; }
  ninja -C build-gpu -j "$(nproc)" vlatune >/tmp/perf-build.log 2>&1 || { tail -60 /tmp/perf-build.log; exit 4; }
  vlatune="$root/build-gpu/cli/vlatune"
fi
"$vlatune" --version

echo "== vlatune train: full, synthetic, batch 32, $steps steps, recipe $recipe"
run_dir=/tmp/vlatune-perf-gate
rm -rf "$run_dir"
"$vlatune" train --config full --data synthetic --batch 32 --steps "$steps" --recipe "$recipe" --seed 0 \
  --timing-warmup 3 --out "$run_dir" --no-progress --log-every 10 --no-save 2>&1 | tail -8
[ "${PIPESTATUS[0]}" = 0 ] || { echo "perf-gate: training failed" >&2; exit 4; }
cp "$run_dir/run.json" "$out/run.json"
cp "$run_dir/metrics.jsonl" "$out/metrics.jsonl" 2>/dev/null
if [ "$no_baseline" = 1 ]; then
  cp "$run_dir/run.json" "$out/$name.json"
  echo "perf-gate: wrote \$OUT/$name.json: commit it as reports/baselines/h200/$name.json"
  exit 0
fi

echo "== vlatune check against reports/baselines/h200/$name.json"
# --update-baseline acts on a copy: the machine's tree is thrown away, the copy comes back in $OUT.
cp "$baseline" "$out/$name.json"
extra=()
[ "$update" = 1 ] && extra+=(--update-baseline)
"$vlatune" check --baseline "$out/$name.json" --candidate "$run_dir/run.json" "${extra[@]}" "${check_args[@]}" \
  2>&1 | tee "$out/check.txt"
rc=${PIPESTATUS[0]}
if [ "$update" = 1 ] && ! cmp -s "$baseline" "$out/$name.json"; then
  echo "perf-gate: improved: commit \$OUT/$name.json as reports/baselines/h200/$name.json"
fi
echo "perf-gate: exit $rc"
exit "$rc"
