#!/usr/bin/env bash
# Plans for smaller GPUs, measured on one: a `vlatune profile` of the full config (bf16, synthetic data, micro-batch
# 32; a second, small profiled batch is left out: with prompt trimming its step time on synthetic data varies with
# each batch's longest prompt, which changes the attention shapes), then `vlatune plan` for 40, 28 and 22 GiB keeping the global batch at 32 (22 GiB with
# `--allow optimizer-state`, since bf16 parameters, gradients and AdamW moments alone take ~25 GiB), and LoRA with
# openpi's preset (recipes/pi05_libero_h200_lora.json: global batch 32 as micro-batch 8 x 4, recomputed).
# Each recipe trains STEPS steps under `--max-memory` equal to its budget; the table gives predicted and measured
# peak and samples/s (median, from run.json). The 200-step numerics gate of 8-bit AdamW is memory-gpu.sh's.
#
#   bash scripts/pack-deps.sh
#   device run: command "bash scripts/dev/fit-gpus-gpu.sh", carry [".deps"]   (~7 min on one H200)
# Options (environment): STEPS (default 30), BUDGETS ("22 28 40"; "" for none), LORA_BUDGET (14), ARCHS (9.0),
# TRAIN_TIMEOUT (240 s per run), ALLOW_PLANS (plans that change what trains, "GiB:choice ...", e.g. "20:lora
# 20:freeze 25:freeze": `vlatune plan --memory-budget GiB --global-batch 32 --allow choice`, trained like the
# others), SKIP_PROFILE=1 reuses /tmp/fit-profile from an earlier call on the same machine.
# Output: $OUT/plan_<GiB>.json, $OUT/plan_<GiB>.txt (--explain), $OUT/run_<name>.json, $OUT/*.log; the table last.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
steps="${STEPS:-30}"
budgets="${BUDGETS-22 28 40}"
lora_budget="${LORA_BUDGET:-14}"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
source scripts/dev/gpu-build.sh
gpu_build "$out" vlatune || exit 1
v=./build-gpu/cli/vlatune
echo "$(el) built"; $v --version

profile=/tmp/fit-profile
if [ "${SKIP_PROFILE:-0}" != 1 ] || [ ! -f "$profile/profile.json" ]; then
  rm -rf "$profile"
  timeout 300 $v profile --config full --data synthetic --batch 32 --trace-steps 0 --gemm-reps 0 \
    --out "$profile" >"$out/profile.log" 2>&1
  echo "$(el) profile exit $?: $(grep -E 'step|peak' "$out/profile.log" | tail -2 | tr '\n' ' ')"
fi

cp recipes/pi05_libero_h200_lora.json "$out/lora.json"
recipes=("lora:$lora_budget")
for gib in $budgets; do
  allow=()
  [ "$gib" -lt 26 ] && allow=(--allow optimizer-state)
  $v plan --profile "$profile" --memory-budget "$gib" --global-batch 32 "${allow[@]}" --out "$out/plan_$gib.json" \
    >"$out/plan_$gib.log" 2>&1
  echo "plan $gib GiB exit $?: $(tail -1 "$out/plan_$gib.log")"
  $v plan --profile "$profile" --memory-budget "$gib" --global-batch 32 "${allow[@]}" --explain \
    >"$out/plan_$gib.txt" 2>&1
  [ -f "$out/plan_$gib.json" ] && recipes+=("plan_$gib:$gib")
done

for entry in ${ALLOW_PLANS:-}; do
  gib="${entry%%:*}"; choice="${entry##*:}"; name="plan_${gib}_$choice"
  $v plan --profile "$profile" --memory-budget "$gib" --global-batch 32 --allow "$choice" --out "$out/$name.json" \
    >"$out/$name.log" 2>&1
  echo "plan $gib GiB --allow $choice exit $?: $(tail -1 "$out/$name.log")"
  [ -f "$out/$name.json" ] && recipes+=("$name:$gib")
done

for entry in "${recipes[@]}"; do
  name="${entry%%:*}"; budget="${entry##*:}"
  rm -rf "/tmp/fit-$name"
  timeout "${TRAIN_TIMEOUT:-240}" $v train --config full --data synthetic --recipe "$out/$name.json" --steps "$steps" --seed 0 \
    --timing-warmup 3 --max-memory "$budget" --out "/tmp/fit-$name" --no-progress --log-every 10 --no-save \
    >"$out/train_$name.log" 2>&1
  echo "$(el) $name exit $?: $(tail -1 "$out/train_$name.log")"
  cp "/tmp/fit-$name/run.json" "$out/run_$name.json" 2>/dev/null
  cp "/tmp/fit-$name/metrics.jsonl" "$out/metrics_$name.jsonl" 2>/dev/null
done

python3 - "$out" "${recipes[@]}" <<'PY'
import json, os, sys
out, entries = sys.argv[1], sys.argv[2:]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
print("\n| recipe | --max-memory GiB | micro x accum | recompute | AdamW state | trained | predicted peak GiB | "
      "peak GiB | predicted samples/s | samples/s (median) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for entry in entries:
    name, budget = entry.split(":")
    r, run = load(os.path.join(out, f"{name}.json")), load(os.path.join(out, f"run_{name}.json"))
    if r is None:
        print(f"| {name} | {budget} | no recipe | | | | | | | |")
        continue
    b, pred = r.get("batch", {}), r.get("predicted", {})
    rec = len(r.get("recompute", {}).get("modules", []))
    state = r.get("optimizer", {}).get("state_dtype", "auto")
    freeze = r.get("freeze", {}).get("presets") or r.get("freeze", {}).get("modules")
    trained = ("LoRA " + r["lora"].get("preset", "targets") if r.get("lora")
               else "frozen: " + ", ".join(freeze) if freeze else "all")
    fmt = lambda x: f"{x:.2f}" if isinstance(x, (int, float)) else "n/a"
    peak = run.get("peak_gib") if run else None
    sps = run.get("samples_per_s_median") if run else None
    print(f"| {name} | {budget} | {b.get('micro_batch')} x {b.get('grad_accum')} | {rec} patterns | {state} | "
          f"{trained} | {fmt(pred.get('peak_gib'))} | {fmt(peak) if run else 'failed'} | "
          f"{fmt(pred.get('samples_per_s'))} | {fmt(sps)} |")
PY
echo "$(el) done"
