#!/usr/bin/env bash
# A/B of a code change on one GPU, in one call: vlatune built twice (the working tree, and the tree with some files
# as a base commit has them), then, per recipe, both binaries trained alternately ROUNDS times, a table of median
# samples/s, and whether the first step's loss is bit-identical between them (a change meant to be exact).
#
#   here:   bash scripts/dev/file-ab-gpu.sh --prepare BASE [PATH...]
#           (the tracked files under PATH (default: all) that differ from BASE, as BASE has them, into .ref/ab_base/)
#   device: command "RECIPES='fp8 bf16' bash scripts/dev/file-ab-gpu.sh", carry [".deps", ".ref"]
#
# RECIPES (space-separated, default "fp8"): fp8, bf16, trimmed, as scripts/dev/pairs.sh sets them up. ROUNDS (2),
# STEPS (25), TIMING_WARMUP (8); TESTS: a Catch2 spec of GPU test cases to run on the tree's build first. Files the
# base commit lacks, or the tree has deleted, are refused at --prepare.
# Output ($OUT): table.md, runs.txt (each run's summary line), tests.log; the build and run logs stay in /tmp/ab-logs
# (the device tool returns a few files only; a failed build prints its log's tail).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
base_dir=.ref/ab_base

if [ "${1:-}" = --prepare ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --prepare BASE [PATH...]" >&2; exit 2; }
  base="$2"
  shift 2
  rm -rf "$base_dir"
  mkdir -p "$base_dir"
  git diff --name-status "$base" -- "$@" | while read -r status path rest; do
    case "$status" in
      M) mkdir -p "$base_dir/$(dirname "$path")" && git show "$base:$path" >"$base_dir/$path" && echo "base: $path" ;;
      *) echo "refused: $path is $status against $base (only modified files can be swapped)" >&2; exit 2 ;;
    esac
  done || exit 2
  [ -n "$(find "$base_dir" -type f)" ] || { echo "no tracked file under ${*:-.} differs from $base" >&2; exit 2; }
  git rev-parse --short=12 "$base" >"$base_dir/.commit"
  exit 0
fi

[ -f "$base_dir/.commit" ] || { echo "no $base_dir: run '$0 --prepare BASE [PATH...]' here first" >&2; exit 2; }
out="${OUT:-$root/out}"
logs=/tmp/ab-logs
rm -rf "$logs"
mkdir -p "$out" "$logs"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
source scripts/dev/gpu-build.sh
mapfile -t files < <(cd "$base_dir" && find . -type f ! -name .commit | sed 's|^\./||')
saved="$(mktemp -d)"
for f in "${files[@]}"; do mkdir -p "$saved/$(dirname "$f")" && cp "$f" "$saved/$f" && cp "$base_dir/$f" "$f"; done
restore() { for f in "${files[@]}"; do cp "$saved/$f" "$f"; done; }
VLATUNE_COMMIT="$(cat "$base_dir/.commit")-files" gpu_build "$logs" vlatune || { restore; exit 1; }
cp build-gpu/cli/vlatune /tmp/vlatune_base
restore
echo "$(el) base built (${#files[@]} file(s) of $(cat "$base_dir/.commit"): ${files[*]})"
gpu_build_tested "$logs" "$out" || exit 1
cp build-gpu/cli/vlatune /tmp/vlatune_tree
echo "$(el) tree built"

source scripts/dev/pairs.sh
train() {  # SIDE RECIPE DATA NAME STEPS [flags]
  local side=$1 recipe=$2 data=$3 name=$4 steps=$5
  shift 5
  rm -rf "/tmp/ab-$name"
  timeout 300 "/tmp/vlatune_$side" train --config full --data "$data" --recipe "$recipe" --steps "$steps" --seed 0 \
    --out "/tmp/ab-$name" --no-progress --no-save "$@" >"$logs/$name.log" 2>&1
}

for r in ${RECIPES:-fp8}; do
  pair_setup "$r" "$logs" /tmp/vlatune_tree || exit $?
  for side in base tree; do
    train "$side" "$pair_recipe" "$pair_data" "${r}_first_$side" 1 --log-every 1
    python3 - "/tmp/ab-${r}_first_$side/metrics.jsonl" >"$logs/loss_${r}_$side.txt" 2>/dev/null <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(repr(next(r["loss"] for r in rows if r.get("step") == 0 and "loss" in r)))
PY
  done
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for side in base tree; do
      train "$side" "$pair_recipe" "$pair_data" "${r}_${side}_$round" "${STEPS:-25}" --timing-warmup "${TIMING_WARMUP:-8}" \
        --log-every "${STEPS:-25}"
      echo "$(el) $r $side round $round: $(grep '^done' "$logs/${r}_${side}_$round.log" | sed 's/;.*//')" |
        tee -a "$out/runs.txt"
      cp "/tmp/ab-${r}_${side}_$round/run.json" "$logs/${r}_${side}_$round.json" 2>/dev/null
    done
  done
done

python3 - "$logs" "$(cat "$base_dir/.commit")" ${RECIPES:-fp8} <<'PY' | tee "$out/table.md"
import json, os, statistics, sys
logs, base, recipes = sys.argv[1], sys.argv[2], sys.argv[3:]
def sps(name):
    try: return json.load(open(os.path.join(logs, name + ".json")))["samples_per_s_median"]
    except (OSError, ValueError, KeyError): return None
def first_loss(r, side):
    try: return open(os.path.join(logs, f"loss_{r}_{side}.txt")).read().strip()
    except OSError: return None
print(f"| recipe | base ({base} files) samples/s | tree samples/s | tree / base | first step's loss |")
print("|---|---|---|---|---|")
for r in recipes:
    rounds = sorted({int(f.rsplit("_", 1)[1][:-5]) for f in os.listdir(logs)
                     if f.startswith(r + "_base_") and f.endswith(".json")})
    b = [x for x in (sps(f"{r}_base_{i}") for i in rounds) if x]
    t = [x for x in (sps(f"{r}_tree_{i}") for i in rounds) if x]
    lb, lt = first_loss(r, "base"), first_loss(r, "tree")
    same = "n/a" if not lb or not lt else ("identical " + lb if lb == lt else f"differs: {lb} vs {lt}")
    fmt = lambda v: " / ".join(f"{x:.2f}" for x in v) or "n/a"
    ratio = f"{statistics.median(t) / statistics.median(b):.4f}x" if b and t else "n/a"
    print(f"| {r} | {fmt(b)} | {fmt(t)} | {ratio} | {same} |")
PY
echo "$(el) done"
