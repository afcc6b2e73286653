#!/usr/bin/env bash
# The FP8 target's planned recipe, measured in one call: `vlatune profile` under the FP8 recipe with nothing
# recomputed and no prompt trimming (the FP8 GEMMs, their casts and the recompute A/B rows measured as they run),
# `vlatune plan --fp8 auto --batch 32 --memory-budget 57` from that profile, then the compiled FP8 PyTorch reference,
# the planned recipe (under --max-memory 57) and the shipped recipes/pi05_libero_h200_fp8.json (untrimmed), each
# 14 steps at batch 32 on synthetic data. A table last: predicted vs measured, and each run's ratio to the reference.
#
#   bash scripts/pack-deps.sh; mkdir -p .ref && cp <pi05_torch_reference.py> .ref/
#   device run: command "bash scripts/dev/fp8-plan-gpu.sh", carry [".deps", ".ref"]   (~8 min on one H200, built)
# Options (environment): BUDGET (57), STEPS (14), TIMING_WARMUP (3: the first steps each run leaves out of its
# median; FP8 steps alternate by up to 25 ms over the first ~15 steps, so 10 of 40 measures the steady state),
# REF (1: run the reference), ARCHS (9.0), PLAN_FLAGS (extra
# `vlatune plan` flags, e.g. "--fp8-include paligemma_with_expert.paligemma.model.vision_tower"),
# SAVED_GEGLU_INPUTS (the recipes' fp8.saved_geglu_inputs, e.g. "e4m3-blocks"), GATE_STEPS (0; N > 0: the planned
# recipe and the default bf16 recipe train N steps from the same weights and data, peak lr after 20 steps, and
# `vlatune check --numerics --curve-loss-only` gates the FP8 loss curve against bf16's), TRIMMED (1: also the
# trimmed-prompt pair: the compiled FP8 reference with `--text 64` against the shipped recipe with prompt trimming on a
# `vlatune data synth --prompt-len 20:64` dataset, so both run 64 text positions), PLAN (1; 0: no profile and no
# plan, the shipped recipe only), FP8_ADD (space-separated patterns: a third run, `shipped_plus`, the shipped recipe
# with these added to its fp8.modules, e.g. the vision tower's Linears: an A/B of those alone), PROFILE_DATA
# (synthetic; "trimmed": profile with prompt trimming on the `--prompt-len 20:64` dataset, so the plan is priced on
# 64 text positions, with fp8.saved_geglu_inputs PROFILE_GEGLU_INPUTS when set; the untrimmed runs and their
# reference are skipped, and with TRIMMED=1 the planned recipe runs in the trimmed pair, as `trimmed_planned`).
# Output ($OUT, at most the eight files the device tool returns): table.md (predicted vs measured), trimmed.md (the
# trimmed pairs), profile.json, planned.json, plan.txt (--explain), numerics.txt, run_{planned,shipped}.json. Every
# file, logs and the other recipes and runs included, stays in /tmp/fp8-plan.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
work=/tmp/fp8-plan  # every file of the call; the device tool returns eight, so $OUT gets the main ones at the end
rm -rf "$work"
mkdir -p "$out" "$work"
budget="${BUDGET:-57}"
steps="${STEPS:-14}"
timing_warmup="${TIMING_WARMUP:-3}"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s]"; }
source scripts/dev/gpu-build.sh
gpu_build "$work" vlatune || exit 1
v=./build-gpu/cli/vlatune
echo "$(el) built"

untrimmed() {  # SRC DEST: the recipe without prompt trimming; "norc" also drops its recompute set
  python3 - "$@" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
r.setdefault("data", {})["trim_text"] = False
if len(sys.argv) > 3 and sys.argv[3] == "norc": r["recompute"] = {"modules": []}
if len(sys.argv) > 3 and sys.argv[3] == "plus": r["fp8"]["modules"] += os.environ["FP8_ADD"].split()
if os.environ.get("SAVED_GEGLU_INPUTS"): r["fp8"]["saved_geglu_inputs"] = os.environ["SAVED_GEGLU_INPUTS"]
json.dump(r, open(sys.argv[2], "w"), indent=2)
PY
}
untrimmed recipes/pi05_libero_h200_fp8.json "$work/fp8_profiled.json" norc
profile_data=synthetic
trim_data() { [ -d /tmp/trim-data ] || $v data synth --config full --samples 768 --prompt-len 20:64 --seed 0 \
  --out /tmp/trim-data >"$work/trim_data.log" 2>&1; }
if [ "${PROFILE_DATA:-synthetic}" = trimmed ]; then
  rm -rf /tmp/trim-data
  trim_data
  profile_data=/tmp/trim-data
  python3 - "$work/fp8_profiled.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
r["data"]["trim_text"] = True
if os.environ.get("PROFILE_GEGLU_INPUTS"): r["fp8"]["saved_geglu_inputs"] = os.environ["PROFILE_GEGLU_INPUTS"]
json.dump(r, open(sys.argv[1], "w"), indent=2)
PY
fi
untrimmed recipes/pi05_libero_h200_fp8.json "$work/shipped.json"
[ -n "${FP8_ADD:-}" ] && untrimmed recipes/pi05_libero_h200_fp8.json "$work/shipped_plus.json" plus

if [ "${PLAN:-1}" = 1 ]; then
  rm -rf /tmp/fp8-profile
  timeout 400 $v profile --config full --data "$profile_data" --batch 32 --recipe "$work/fp8_profiled.json" --trace-steps 0 \
    --warmup 3 --timed-steps 5 --ab-steps 2 --gemm-reps 5 --out /tmp/fp8-profile >"$work/profile.log" 2>&1
  echo "$(el) profile exit $?"
  cp /tmp/fp8-profile/profile.json "$work/profile.json"
  $v plan --profile /tmp/fp8-profile --fp8 auto --batch 32 --memory-budget "$budget" ${PLAN_FLAGS:-} \
    --out "$work/planned.json" >"$work/plan.log" 2>&1
  echo "plan exit $?: $(tail -1 "$work/plan.log")"
  $v plan --profile /tmp/fp8-profile --fp8 auto --batch 32 --memory-budget "$budget" ${PLAN_FLAGS:-} --explain \
    >"$work/plan.txt" 2>&1
fi

: >"$work/reference.jsonl"
untrimmed_runs="planned shipped shipped_plus"
[ "${PROFILE_DATA:-synthetic}" = trimmed ] && untrimmed_runs=""
if [ "${REF:-1}" = 1 ] && [ -n "$untrimmed_runs" ]; then
  PYTHONUNBUFFERED=1 python3 .ref/pi05_torch_reference.py --slots 2 --attn sdpa --recompute vit --compile layer \
    --fp8 tensorwise --steps 10 --warmup 3 --tag compiled-fp8 >"$work/reference.log" 2>&1
  grep RESULT "$work/reference.log" | sed 's/^RESULT //' >>"$work/reference.jsonl"
  echo "$(el) reference: $(tail -1 "$work/reference.jsonl")"
fi

for name in $untrimmed_runs; do
  [ -f "$work/$name.json" ] || continue
  rm -rf "/tmp/fp8-$name"
  timeout 240 $v train --config full --data synthetic --recipe "$work/$name.json" --steps "$steps" --seed 0 \
    --timing-warmup "$timing_warmup" --max-memory "$budget" --out "/tmp/fp8-$name" --no-progress --log-every 5 --no-save \
    >"$work/train_$name.log" 2>&1
  echo "$(el) $name exit $?: $(tail -1 "$work/train_$name.log")"
  cp "/tmp/fp8-$name/run.json" "$work/run_$name.json" 2>/dev/null
done

if [ "${TRIMMED:-0}" = 1 ]; then
  trim_data
  python3 - recipes/pi05_libero_h200_fp8.json "$work/trimmed.json" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
if os.environ.get("SAVED_GEGLU_INPUTS"): r["fp8"]["saved_geglu_inputs"] = os.environ["SAVED_GEGLU_INPUTS"]
json.dump(r, open(sys.argv[2], "w"), indent=2)
PY
  if [ "${REF:-1}" = 1 ]; then
    PYTHONUNBUFFERED=1 python3 .ref/pi05_torch_reference.py --slots 2 --attn sdpa --recompute vit --compile layer \
      --fp8 tensorwise --text 64 --steps 10 --warmup 3 --tag compiled-fp8-trim >"$work/reference_trim.log" 2>&1
    grep RESULT "$work/reference_trim.log" | sed 's/^RESULT //' >"$work/reference_trim.jsonl"
  fi
  trimmed_runs=(trimmed)
  if [ "${PROFILE_DATA:-synthetic}" = trimmed ] && [ -f "$work/planned.json" ]; then
    trimmed_runs+=(trimmed_planned)
    cp "$work/planned.json" "$work/trimmed_planned.json"
  fi
  for name in "${trimmed_runs[@]}"; do
    rm -rf "/tmp/fp8-$name"
    timeout 240 $v train --config full --data /tmp/trim-data --recipe "$work/$name.json" --steps "$steps" --seed 0 \
      --timing-warmup "$timing_warmup" --max-memory "$budget" --out "/tmp/fp8-$name" --no-progress --log-every 5 \
      --no-save >"$work/train_$name.log" 2>&1
    echo "$(el) $name exit $?: $(tail -1 "$work/train_$name.log")"
    cp "/tmp/fp8-$name/run.json" "$work/run_$name.json" 2>/dev/null
  done
  python3 - "$work" "${trimmed_runs[@]}" <<'PY' | tee "$work/trimmed.md"
import json, os, sys
out = sys.argv[1]
for name in sys.argv[2:]:
    try:
        ref = json.loads(open(os.path.join(out, "reference_trim.jsonl")).read().splitlines()[-1])
        run = json.load(open(os.path.join(out, f"run_{name}.json")))
        sps = run["samples_per_s_median"]
        print(f"{name}: reference {ref['samples_per_s']:.2f} samples/s ({ref['peak_gib']:.2f} GiB), vlatune "
              f"{sps:.2f} ({run['peak_gib']:.2f} GiB): {sps / ref['samples_per_s']:.3f}x")
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        print(f"{name} pair incomplete: {e}")
PY
fi

if [ "${GATE_STEPS:-0}" -gt 0 ] && [ -f "$work/planned.json" ]; then
  echo '{"schema": "vlatune.recipe/1", "data": {"trim_text": false}}' >"$work/bf16.json"
  for name in planned bf16; do
    rm -rf "/tmp/gate-$name"
    timeout 400 $v train --config full --data synthetic --recipe "$work/$name.json" --steps "$GATE_STEPS" \
      --warmup-steps 20 --seed 0 --timing-warmup 3 --out "/tmp/gate-$name" --no-progress --log-every 50 --no-save \
      >"$work/gate_$name.log" 2>&1
    echo "$(el) gate run $name exit $?: $(tail -1 "$work/gate_$name.log")"
  done
  $v check --numerics --curve-loss-only --baseline /tmp/gate-bf16/run.json --candidate /tmp/gate-planned/run.json \
    >"$work/numerics.txt" 2>&1
  echo "numerics gate exit $?"; tail -5 "$work/numerics.txt"
fi

python3 - "$work" <<'PY' | tee "$work/table.md"
import json, os, sys
out = sys.argv[1]
def load(p):
    try: return json.load(open(os.path.join(out, p)))
    except (OSError, ValueError): return None
ref = None
for line in open(os.path.join(out, "reference.jsonl")):
    ref = json.loads(line)
if ref: print(f"reference compiled-fp8: {ref['samples_per_s']:.2f} samples/s, peak {ref['peak_gib']:.2f} GiB")
print("| recipe | recompute | FP8 patterns | predicted samples/s | samples/s (median) | prediction error | "
      "predicted peak GiB | peak GiB | vs reference |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("planned", "shipped", "shipped_plus"):
    r, run = load(f"{name}.json"), load(f"run_{name}.json")
    if r is None: continue
    pred = r.get("predicted", {})
    sps = run.get("samples_per_s_median") if run else None
    p_sps = pred.get("samples_per_s")
    err = f"{100 * (p_sps / sps - 1):+.1f}%" if sps and p_sps else "n/a"
    vs = f"{sps / ref['samples_per_s']:.3f}x" if sps and ref else "n/a"
    f = lambda x: f"{x:.2f}" if isinstance(x, (int, float)) else "n/a"
    print(f"| {name} | {len(r.get('recompute', {}).get('modules', []))} | {len(r.get('fp8', {}).get('modules', []))} | "
          f"{f(p_sps)} | {f(sps)} | {err} | {f(pred.get('peak_gib'))} | {f(run.get('peak_gib') if run else None)} | {vs} |")
PY
for f in table.md trimmed.md profile.json planned.json plan.txt numerics.txt run_planned.json run_shipped.json; do
  [ -f "$work/$f" ] && cp "$work/$f" "$out/"
done
echo "$(el) done"
