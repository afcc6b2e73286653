#!/usr/bin/env bash
# Issues 10 and 11: data-parallel runs on two (or --nproc N) GPUs in one device call (`nvidia-h200-x2`). Builds
# vlatune (scripts/gpu-check.sh --build-only), then, each under a timeout so that a hang cannot eat the call:
#   (a) the distributed GPU test cases ("[gpu][distributed]": 2 ranks vs 1 GPU with grad_accum 2, NCCL);
#   (b) `vlatune train`, full model, synthetic data, batch 32 per GPU, STEPS steps, no checkpoint written:
#       1 GPU; 2 GPUs with per-group buckets (the named units); 2 GPUs with the planned groups of
#       recipes/pi05_libero_h200_x2.json (`vlatune plan --world-size 2`: the vision tower split per layer); 2 GPUs
#       with one bucket after backward; the same three with NCCL_P2P_DISABLE=1 (NCCL through host memory: the
#       PCIe-like link); with --nccl-channels LIST, the planned recipe on NVLink once per NCCL_MAX_NCHANNELS value;
#   (c) `vlatune launch --nproc N -- profile` (short: no A/B, 2 GEMM repetitions) -> profile.json with the
#       communication section, then `vlatune plan --world-size N --batch 32 --explain` on it;
#   (d) a rank killed with SIGKILL mid-run (tiny model, processes started torchrun-style without launch): the
#       survivor must exit non-zero within --dist-timeout plus a margin, with a message;
# and prints a table last: samples/s (global), scaling vs 1 GPU, exposed communication (step_ms at 2 GPUs - step_ms
# at 1 GPU, same per-GPU batch) and its share of the step, peak GiB, wall time per run.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0) throughout.
#
# From the development machine:
#   bash scripts/pack-deps.sh
#   device run: kind nvidia-h200-x2, command "bash scripts/multi-gpu-check.sh", carry [".deps"], timeout_s 600
# Everything lands in $OUT (logs, run.json and metrics.jsonl per run, profile.json, the plan, summary.txt).
#
# Time (estimates; the table's wall column measures them): build ~120 s; (a) ~25 s; (b) 5 x ~30 s (start-up of the
# full model ~15-20 s + STEPS steps of ~0.6 s); (c) ~60 s; (d) ~40 s; ~430 s in all. A step is skipped, and says
# so, when it would end past BUDGET_S seconds (default 560) after the start.
#
# Options: --steps N (default 12), --no-build (reuse build-gpu/ from an earlier call in the same session),
#          --budget S (default 560), --only LIST (comma-separated subset of: tests,train,profile,kill),
#          --nccl-channels LIST (comma-separated NCCL_MAX_NCHANNELS values to try on NVLink; none by default; the
#          same runs as --nccl-env with one NCCL_MAX_NCHANNELS=C entry per value),
#          --nccl-env LIST (semicolon-separated settings, each one or more space-separated VAR=VALUE, to try one at a
#          time on NVLink with the planned groups, e.g. "NCCL_PROTO=Simple;TORCH_NCCL_HIGH_PRIORITY=1"),
#          --nvlink-only (train: 1 GPU and the NVLink runs; no one-bucket or host-memory runs),
#          --nproc N (default 2: the data-parallel runs, the profile and the plan use N GPUs; the eight-GPU run
#          is `--nproc 8` on `nvidia-h200-x8`). With N other than 2, the profile and the plan run first, and the
#          "planned" runs train the recipe just planned for N GPUs at batch 32 ($OUT/plan_worldN.json) instead of
#          the shipped two-GPU one. The rank-kill check and the test cases stay at two ranks.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
out="${OUT:-$root/out}"
mkdir -p "$out"
steps=12
build=1
budget=560
only="tests,train,profile,kill"
channels=""
nccl_env=""
nvlink_only=0
nproc=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --budget) budget="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --nccl-channels) channels="$2"; shift 2 ;;
    --nccl-env) nccl_env="$2"; shift 2 ;;
    --nvlink-only) nvlink_only=1; shift ;;
    --nproc) nproc="$2"; shift 2 ;;
    *) echo "multi-gpu-check: unknown option '$1'" >&2; exit 4 ;;
  esac
done
[[ "$nproc" =~ ^[0-9]+$ ]] && [ "$nproc" -ge 2 ] || { echo "multi-gpu-check: --nproc must be >= 2" >&2; exit 4; }
planned="recipes/pi05_libero_h200_x2.json"
[ "$nproc" = 2 ] || planned="$out/plan_world${nproc}.json"
np="${nproc}gpu"
export NCCL_NVLS_ENABLE=0
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
log() { echo "== [$(elapsed)s] $*"; }
wants() { [[ ",$only," == *",$1,"* ]]; }
# fits SECONDS: true when a step estimated at SECONDS still ends inside the budget.
fits() { [ $(( $(elapsed) + $1 )) -le "$budget" ]; }
: >"$out/results.txt"  # one line per step: kind label rc wall_s [extra]

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || true
nvidia-smi topo -m 2>/dev/null | head -4 || true

if [ "$build" = 1 ]; then
  log "build"
  build_args=(--build-only)
  grep -q -- "--build-only" scripts/gpu-check.sh || build_args=(--skip-tests --no-ctest --bench-filter NONE_)
  timeout -k 10 330 bash scripts/gpu-check.sh "${build_args[@]}" >"$out/build.log" 2>&1 || {
    tail -30 "$out/build.log"
    exit 1
  }
  tail -2 "$out/build.log"
fi
echo "build $(elapsed)" >"$out/build_s.txt"
bin="$root/build-gpu/cli/vlatune"
tests="$root/build-gpu/tests/vlatune_tests_torch"
[ -x "$bin" ] || { echo "multi-gpu-check: $bin missing" >&2; exit 1; }
no_save=(--no-save)
"$bin" train --help 2>/dev/null | grep -q -- --no-save || no_save=()

# ---- (a) GPU test cases of the distributed issue ----
if wants tests; then
  log "(a) GPU tests [gpu][distributed]"
  t=$(date +%s)
  timeout -k 10 150 "$tests" "[gpu][distributed]" --durations yes >"$out/tests_dist_gpu.log" 2>&1
  rc=$?
  tail -6 "$out/tests_dist_gpu.log"
  echo "tests [gpu][distributed] $rc $(( $(date +%s) - t ))" >>"$out/results.txt"
fi

# ---- (b) training throughput ----
# run_train LABEL NPROC ENV... -- TRAIN_ARGS...
run_train() {
  local label="$1" nproc="$2"
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  if ! fits 45; then
    log "(b) $label: skipped (budget)"
    echo "train $label skipped 0" >>"$out/results.txt"
    return
  fi
  local dir="/tmp/mgc-$label"
  rm -rf "$dir"
  local cmd=(train --config full --data synthetic --batch 32 --steps "$steps" --timing-warmup 3 --no-progress
    --log-every 4 --checkpoint-every 0 ${no_save[@]+"${no_save[@]}"} --dist-timeout 120 --out "$dir" "$@")
  [ "$nproc" -gt 1 ] && cmd=(launch --nproc "$nproc" -- "${cmd[@]}")
  log "(b) $label: ${envs[*]} vlatune ${cmd[*]}"
  local t
  t=$(date +%s)
  env ${envs[@]+"${envs[@]}"} timeout -k 10 150 "$bin" "${cmd[@]}" >"$out/train_$label.log" 2>&1
  local rc=$?
  local wall=$(( $(date +%s) - t ))
  grep -E "data-parallel|^done|error|failed" "$out/train_$label.log" | tail -5
  cp "$dir/run.json" "$out/train_$label.json" 2>/dev/null
  cp "$dir/metrics.jsonl" "$out/train_${label}_metrics.jsonl" 2>/dev/null
  rm -rf "$dir"  # a full checkpoint is ~20 GB (none with --no-save; removed in any case)
  echo "train $label $rc $wall" >>"$out/results.txt"
}
# ---- (c) profile with the communication section, then the plan at world size N ----
profile_and_plan() {
  if ! fits 100; then
    log "(c) profile: skipped (budget)"
    echo "profile world$nproc skipped 0" >>"$out/results.txt"
    return
  fi
  local prof=/tmp/mgc-profile
  rm -rf "$prof"
  log "(c) vlatune launch --nproc $nproc -- profile (full, batch 32)"
  local t rc
  t=$(date +%s)
  # --dist-timeout covers the other ranks waiting at the final barrier while rank 0 alone times the GEMMs.
  timeout -k 10 240 "$bin" launch --nproc "$nproc" -- profile --config full --data synthetic --batch 32 --steps 3 --warmup 1 \
    --timed-steps 3 --trace-steps 1 --ab-steps 0 --gemm-reps 2 --dist-timeout 200 --out "$prof" \
    >"$out/profile.log" 2>&1
  rc=$?
  grep -E "^profile: (batch|communication|no NCCL)|error|failed" "$out/profile.log" | tail -8
  echo "profile world$nproc $rc $(( $(date +%s) - t ))" >>"$out/results.txt"
  cp "$prof/profile.json" "$out/profile_world$nproc.json" 2>/dev/null
  # The Perfetto trace of one traced step (NCCL kernels beside backward) when it is small enough to bring back.
  [ -f "$prof/trace.json.gz" ] && [ "$(stat -c %s "$prof/trace.json.gz")" -lt 50000000 ] &&
    cp "$prof/trace.json.gz" "$out/trace_world$nproc.json.gz"
  if [ -f "$prof/profile.json" ]; then
    log "(c) vlatune plan --world-size $nproc --batch 32 --explain"
    timeout -k 5 60 "$bin" plan --profile "$prof/profile.json" --world-size "$nproc" --batch 32 --explain \
      --out "$out/plan_world$nproc.json" >"$out/plan_world$nproc.log" 2>&1
    echo "plan world$nproc $? 0" >>"$out/results.txt"
    grep -i -E "communication|group|all-reduce|predicted" "$out/plan_world$nproc.log" | head -20
  fi
  rm -rf "$prof"
}
# With N other than 2 the planned runs need the plan made here first.
[ "$nproc" != 2 ] && wants profile && profile_and_plan

if wants train; then
  run_train 1gpu 1 --
  run_train "${np}_nvlink_groups" "$nproc" -- --dist-buckets groups
  if [ -f "$planned" ]; then
    run_train "${np}_nvlink_planned" "$nproc" -- --dist-buckets groups --recipe "$planned"
  fi
  if [ "$nvlink_only" = 0 ]; then
    run_train "${np}_nvlink_one" "$nproc" -- --dist-buckets one
    run_train "${np}_hostmem_groups" "$nproc" NCCL_P2P_DISABLE=1 -- --dist-buckets groups
    if [ -f "$planned" ]; then
      run_train "${np}_hostmem_planned" "$nproc" NCCL_P2P_DISABLE=1 -- --dist-buckets groups --recipe "$planned"
    fi
    run_train "${np}_hostmem_one" "$nproc" NCCL_P2P_DISABLE=1 -- --dist-buckets one
  fi
  # --nccl-channels C1,C2 is --nccl-env "NCCL_MAX_NCHANNELS=C1;NCCL_MAX_NCHANNELS=C2", tried first.
  IFS=',' read -ra channel_list <<<"$channels"
  env_list=()
  for c in ${channel_list[@]+"${channel_list[@]}"}; do env_list+=("NCCL_MAX_NCHANNELS=$c"); done
  IFS=';' read -ra more_env <<<"$nccl_env"
  env_list+=(${more_env[@]+"${more_env[@]}"})
  for i in "${!env_list[@]}"; do
    read -ra settings <<<"${env_list[$i]}"
    echo "${env_list[$i]}" >"$out/env_${np}_nvlink_planned_env$i.txt"  # the row title of the summary
    run_train "${np}_nvlink_planned_env$i" "$nproc" "${settings[@]}" -- --dist-buckets groups --recipe "$planned"
  done
fi

[ "$nproc" = 2 ] && wants profile && profile_and_plan

# ---- (d) a rank killed mid-run: the survivor ends with an error within the timeout ----
if wants kill; then
  if fits 60; then
    kill_dir=/tmp/mgc-kill
    rm -rf "$kill_dir"
    mkdir -p "$kill_dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    dist_timeout=20
    log "(d) rank kill: tiny model, 2 ranks, --dist-timeout $dist_timeout, SIGKILL to rank 1"
    pids=()
    for r in 0 1; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$bin" train --config tiny --device cuda --data synthetic --batch 2 --steps 1000000 --no-progress \
        --log-every 100 --checkpoint-every 0 ${no_save[@]+"${no_save[@]}"} --dist-timeout "$dist_timeout" --workers 1 \
        --out "$kill_dir/run" >"$out/kill_rank$r.log" 2>&1 &
      pids+=($!)
    done
    # Wait (up to 60 s) until rank 0 is stepping, then kill rank 1.
    for _ in $(seq 1 120); do
      grep -q "^step " "$out/kill_rank0.log" 2>/dev/null && break
      sleep 0.5
    done
    sleep 1
    kill -9 "${pids[1]}" 2>/dev/null
    t=$(date +%s)
    limit=$(( dist_timeout + 40 ))
    while kill -0 "${pids[0]}" 2>/dev/null && [ $(( $(date +%s) - t )) -lt "$limit" ]; do sleep 0.5; done
    if kill -0 "${pids[0]}" 2>/dev/null; then
      kill -9 "${pids[0]}" 2>/dev/null
      wait "${pids[0]}" 2>/dev/null
      echo "kill survivor HANG $(( $(date +%s) - t ))" >>"$out/results.txt"
      log "(d) FAIL: rank 0 still running ${limit}s after rank 1 was killed"
    else
      wait "${pids[0]}"
      rc=$?
      echo "kill survivor $rc $(( $(date +%s) - t ))" >>"$out/results.txt"
      log "(d) rank 0 exited with $rc, $(( $(date +%s) - t ))s after rank 1 was killed; its last lines:"
    fi
    wait "${pids[1]}" 2>/dev/null
    tail -5 "$out/kill_rank0.log" | cut -c1-400
    rm -rf "$kill_dir"
  else
    log "(d) rank kill: skipped (budget)"
    echo "kill survivor skipped 0" >>"$out/results.txt"
  fi
fi

log "summary"
python3 - "$out" "$(elapsed)" <<'PY' | tee "$out/summary.txt"
import json, os, re, statistics, sys
out, total = sys.argv[1], sys.argv[2]
results = [l.split() for l in open(os.path.join(out, "results.txt")) if l.strip()]
def run(label):
    p = os.path.join(out, "train_%s.json" % label)
    return json.load(open(p)) if os.path.exists(p) else None
def step_ms(r):
    return statistics.median(r["per_step"]["step_ms"]) if r and r["per_step"]["step_ms"] else None
def startup(label, wall):
    p = os.path.join(out, "train_%s_metrics.jsonl" % label)
    if not os.path.exists(p): return "-"
    s = sum(json.loads(l).get("step_ms", 0) for l in open(p) if l.strip()) / 1e3
    return "%.0f" % (float(wall) - s)
base = run("1gpu")
base_sps, base_ms = (base or {}).get("samples_per_s_median"), step_ms(base)
def label_name(label):
    # "1gpu", "<N>gpu_<link>_<groups|planned|one>[_env<i>]" -> a row title
    m = re.match(r"(\d+)gpu(?:_(nvlink|hostmem)_(groups|planned|one)(?:_env(\d+))?)?$", label)
    if not m: return label
    n, link, kind, env = m.groups()
    if not link: return "%s GPU" % n
    text = "%s GPU %s, %s" % (n, "NVLink" if link == "nvlink" else "host mem (P2P off)",
                              {"groups": "per-group buckets", "planned": "planned groups", "one": "one bucket"}[kind])
    if env is not None:
        p = os.path.join(out, "env_%s.txt" % label)
        text += ", " + (open(p).read().strip() if os.path.exists(p) else "env " + env)
    return text
rows = [("run", "rc", "samples/s (global)", "scaling", "exposed ms", "% of step", "peak GiB", "step ms", "wall s",
         "start-up s")]
for kind, label, rc, wall, *rest in results:
    if kind != "train": continue
    r = run(label)
    sps, ms = (r or {}).get("samples_per_s_median"), step_ms(r)
    world = (r or {}).get("environment", {}).get("world_size", 1)
    scaling = "%.3f" % (sps / (world * base_sps)) if sps and base_sps and world > 1 else "-"
    exposed = ms - base_ms if ms and base_ms and world > 1 else None
    rows.append((label_name(label), rc, "%.2f" % sps if sps else "-", scaling,
                 "%.1f" % exposed if exposed is not None else "-",
                 "%.1f%%" % (100 * exposed / ms) if exposed is not None else "-",
                 "%.2f" % r["peak_gib"] if r and r.get("peak_gib") else "-", "%.1f" % ms if ms else "-", wall,
                 startup(label, wall) if rc != "skipped" else "-"))
w = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
for row in rows: print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(row)))
print("(exposed = median step_ms at N GPUs - at 1 GPU, same per-GPU batch 32; scaling = samples/s / (N x 1 GPU's);"
      " reference DDP: NVLink 0.996 / 0.967, host memory 0.874 / 0.783; targets >= 0.99 NVLink, >= 0.92 host memory,"
      " exposed <= 5% on NVLink)")
profiles = sorted(f for f in os.listdir(out) if re.match(r"profile_world\d+\.json$", f))
p = os.path.join(out, profiles[0]) if profiles else ""
if os.path.exists(p):
    c = json.load(open(p)).get("communication")
    if c:
        mib = sum(g["bytes"] for g in c["groups"]) / 2**20
        ms = sum(g["allreduce_ms"] for g in c["groups"])
        print("profile (%d GPUs, traced): %d groups, %.0f MiB, all-reduce %.2f ms/step, bus %.1f GB/s, exposed %.2f ms/step"
              % (c.get("world_size", 0), len(c["groups"]), mib, ms, c["allreduce_gbps"], c["exposed_ms"]))
    else:
        print("profile (%s): NO communication section (see profile.log)" % os.path.basename(p))
for kind, label, rc, wall, *rest in results:
    if kind == "kill":
        verdict = ("PASS (exited non-zero after the peer died)" if rc not in ("0", "HANG", "skipped")
                   else "FAIL" if rc != "skipped" else "skipped")
        print("rank kill: survivor rc %s, %s s after the kill: %s" % (rc, wall, verdict))
    elif kind != "train":
        print("%s %s: rc %s, %s s" % (kind, label, rc, wall))
print("total %s s" % total)
PY
