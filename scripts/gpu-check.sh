#!/usr/bin/env bash
# Builds vlatune on the GPU machine against its torch wheel, runs the GPU test cases ([.gpu]) and the CPU
# tests, the benchmarks, and optionally the PyTorch reference beside them; prints a short table last.
#
# From the development machine (see README "Testing and measuring on a GPU host"):
#   bash scripts/pack-deps.sh && mkdir -p .ref && cp /path/to/pi05_torch_reference.py .ref/   (the PyTorch reference, kept outside this repository)
#   device run: command "bash scripts/gpu-check.sh --ref compiled", carry [".deps", ".ref"]
#
# Environment: VLATUNE_COMMIT names the commit (else git's HEAD: a device copy's git metadata can lag the tree);
# ARCHS the CUDA architectures (default 9.0; scripts/dev/gpu-build.sh).
#
# Options:
#   --ref LIST     comma-separated reference variants to run in the same call (none by default):
#                  eager-sdpa   (2 slots, SDPA, ViT recomputed)          compiled      (+ torch.compile per layer)
#                  compiled-fp8 (+ FP8 tensorwise)                       compiled-norc (compiled, nothing recomputed)
#                  compiled-fp8-trim (compiled + FP8, prompts of 64 tokens)
#   --bench-filter REGEX   Google Benchmark filter (default: all)
#   --bench-repetitions N  Google Benchmark repetitions (default: 10)
#   --test-filter SPEC     Catch2 test spec for the GPU tests (default: "[gpu]")
#   --train-steps N        also run `vlatune train` (full size, synthetic data, batch 32, ViT recomputed) for N steps
#   --train-recipes LIST   with --train-steps: instead, train once per recipe in the comma-separated LIST ("none" =
#                          the default recipe); the summary gives each run's ratio to the reference variant doing
#                          the same work (FP8 recipes vs compiled-fp8, the others vs compiled)
#   --build-only           build and exit (e.g. before starting side jobs on another GPU)
#   --no-build             use the existing build-gpu/ (after --build-only in the same call)
#   --skip-tests           only build and benchmark
#   --no-ctest             run the GPU tests but not the CPU tests (ctest)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
refs=""
bench_filter="."
bench_reps=10
test_filter="[gpu]"
skip_tests=0
no_ctest=0
train_steps=0
train_recipes=""
build_only=0
no_build=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ref) refs="$2"; shift 2 ;;
    --bench-filter) bench_filter="$2"; shift 2 ;;
    --bench-repetitions) bench_reps="$2"; shift 2 ;;
    --test-filter) test_filter="$2"; shift 2 ;;
    --skip-tests) skip_tests=1; shift ;;
    --no-ctest) no_ctest=1; shift ;;
    --train-steps) train_steps="$2"; shift 2 ;;
    --train-recipes) train_recipes="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --no-build) no_build=1; shift ;;
    *) echo "gpu-check: unknown option '$1'" >&2; exit 4 ;;
  esac
done
python="$(command -v python3)"
status=0
log() { echo "== $*"; }

log "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

t0=$(date +%s)
if [ "$no_build" = 0 ]; then
log "build (build-gpu/)"
source scripts/dev/gpu-build.sh
gpu_build /tmp || { cp /tmp/cmake.log /tmp/build.log "$out/" 2>/dev/null; exit 1; }
build_s=$(( $(date +%s) - t0 ))
echo "built in ${build_s}s"
fi
[ "$no_build" = 1 ] && build_s=0
./build-gpu/cli/vlatune --version
[ "$build_only" = 1 ] && exit 0

if [ "$skip_tests" = 0 ]; then
  log "GPU tests ($test_filter)"
  ./build-gpu/tests/vlatune_tests_torch "$test_filter" --durations yes 2>&1 | tee "$out/tests_gpu.log" | tail -40
  gpu_rc=${PIPESTATUS[0]}; [ "$gpu_rc" = 0 ] || status=1
  if [ "$no_ctest" = 0 ]; then
    log "CPU tests (ctest)"
    ctest --test-dir build-gpu --output-on-failure 2>&1 | tail -15
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  fi
fi

if [ "$train_steps" -gt 0 ] && [ -n "$train_recipes" ]; then
  IFS=',' read -ra recipes <<<"$train_recipes"
  for r in "${recipes[@]}"; do
    label="$(basename "$r" .json)"
    args=()
    [ "$r" = none ] || args=(--recipe "$r")
    log "vlatune train: full, synthetic, batch 32, $train_steps steps, recipe $r"
    rm -rf /tmp/vlatune-run
    ./build-gpu/cli/vlatune train --config full --data synthetic --batch 32 --steps "$train_steps" "${args[@]}" \
      --out /tmp/vlatune-run --no-progress --log-every 5 --no-save 2>&1 | tail -6
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    cp /tmp/vlatune-run/run.json "$out/train_$label.json" 2>/dev/null
    cp /tmp/vlatune-run/metrics.jsonl "$out/train_${label}_metrics.jsonl" 2>/dev/null
    rm -rf /tmp/vlatune-run
  done
elif [ "$train_steps" -gt 0 ]; then
  log "vlatune train: full, synthetic, batch 32, ViT recomputed, $train_steps steps"
  recipe=/tmp/vit_recompute.json
  echo '{"schema": "vlatune.recipe/1", "recompute": {"modules": ["paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*"]}}' >"$recipe"
  rm -rf /tmp/vlatune-run
  ./build-gpu/cli/vlatune train --config full --data synthetic --batch 32 --steps "$train_steps" --recipe "$recipe" \
    --out /tmp/vlatune-run --no-progress --log-every 5 --no-save 2>&1 | tail -12
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  cp /tmp/vlatune-run/run.json "$out/train_run.json" 2>/dev/null
  cp /tmp/vlatune-run/metrics.jsonl "$out/train_metrics.jsonl" 2>/dev/null
fi

: >"$out/reference.jsonl"
if [ -n "$refs" ]; then
  ref="$root/.ref/pi05_torch_reference.py"
  [ -f "$ref" ] || { echo "gpu-check: $ref missing (put the PyTorch reference script there)" >&2; exit 4; }
  IFS=',' read -ra variants <<<"$refs"
  for v in "${variants[@]}"; do
    case "$v" in
      eager-sdpa) flags="--slots 2 --attn sdpa --recompute vit" ;;
      compiled) flags="--slots 2 --attn sdpa --recompute vit --compile layer" ;;
      compiled-fp8) flags="--slots 2 --attn sdpa --recompute vit --compile layer --fp8 tensorwise" ;;
      compiled-norc) flags="--slots 2 --attn sdpa --recompute none --compile layer" ;;
      compiled-fp8-trim) flags="--slots 2 --attn sdpa --recompute vit --compile layer --fp8 tensorwise --text 64" ;;
      *) echo "gpu-check: unknown reference variant '$v'" >&2; exit 4 ;;
    esac
    log "reference $v: $flags"
    PYTHONUNBUFFERED=1 "$python" "$ref" $flags --steps 10 --warmup 3 --tag "$v" 2>&1 | tee "/tmp/ref_$v.log" | grep RESULT \
      | sed 's/^RESULT //' >>"$out/reference.jsonl"
  done
fi

log "benchmarks"
./build-gpu/bench/vlatune_bench --benchmark_filter="$bench_filter" --benchmark_repetitions="$bench_reps" \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/bench.json" --benchmark_out_format=json 2>&1 | tail -30

log "summary"
"$python" - "$out/bench.json" "$out/reference.jsonl" "$build_s" "$out/train_run.json" <<'PY'
import json, os, sys
bench, refs, build_s, train = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = []
try:
    for b in json.load(open(bench))["benchmarks"]:
        if b.get("aggregate_name") != "median": continue
        extra = {k: v for k, v in b.items() if k in ("TFLOP/s", "GB/s", "samples/s", "peak_GiB")}
        rows.append((b["run_name"], "%.3f ms" % b["real_time"], ", ".join("%s %.1f" % kv for kv in extra.items())))
except FileNotFoundError:
    pass
except Exception as e:
    # An empty file: the benchmark filter matched nothing (the targets' runs pass NONE_ on purpose).
    if open(bench).read().strip():
        rows.append(("bench.json", "unreadable", str(e)))
for line in open(refs):
    r = json.loads(line)
    rows.append(("reference " + r["tag"], "%.1f ms" % (r["step_s_median"] * 1e3),
                 "samples/s %.1f, peak_GiB %.1f" % (r["samples_per_s"], r["peak_gib"])))
ref_by_tag = {json.loads(l)["tag"]: json.loads(l) for l in open(refs)}
import glob
for path in sorted(glob.glob(os.path.join(os.path.dirname(train), "train_*.json"))):
    if path == train: continue
    r = json.load(open(path))
    fp8 = "fp8" in os.path.basename(path)  # recipe files name their precision
    ref = ref_by_tag.get("compiled-fp8" if fp8 else "compiled")
    sps = r.get("samples_per_s_median") or 0
    ratio = ", %.3fx %s" % (sps / ref["samples_per_s"], ref["tag"]) if ref and ref["samples_per_s"] else ""
    rows.append(("vlatune " + os.path.basename(path)[6:-5], "%.1f ms" % (32e3 / sps) if sps else "-",
                 "samples/s %.2f, peak_GiB %.2f%s" % (sps, r.get("peak_gib") or 0, ratio)))
if os.path.exists(train):
    r = json.load(open(train))
    ms = sorted(r["per_step"]["step_ms"])
    rows.append(("vlatune train (full, bs %d)" % r["batch"], "%.1f ms" % ms[len(ms) // 2] if ms else "-",
                 "samples/s %.1f, peak_GiB %.1f" % (r["samples_per_s_median"] or 0, r["peak_gib"] or 0)))
rows.append(("build", "%s s" % build_s, ""))
w = max(len(r[0]) for r in rows)
print("%-*s  %-12s  %s" % (w, "what", "median", "counters"))
for r in rows: print("%-*s  %-12s  %s" % (w, *r))
PY
exit $status
