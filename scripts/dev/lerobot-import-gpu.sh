#!/usr/bin/env bash
# The LeRobot import measured on the GPU machine in one call: build (FFmpeg and SentencePiece from .deps), generate
# LIBERO-shaped LeRobot datasets (2 cameras 256x256, fps 10, episodes of ~160 frames: v2.1 with PNG frames as
# openpi's physical-intelligence/libero stores them, v3.0 with AV1 video as lerobot/libero does), import each with
# every core (frames/s, bytes per frame) and with 1 and 4 workers on a subset (scaling), then train full size at
# batch 32 from the imported PNG dataset with the FP8 recipe (data wait per step). A table last.
#
# From the development machine: bash scripts/pack-deps.sh, then device run
#   command "bash scripts/dev/lerobot-import-gpu.sh"  carry [".deps"]
# Environment: EPISODES (per storage, default 40), TRAIN_STEPS (default 40), VLATUNE_COMMIT, AV1_DATA (a LeRobot AV1
# dataset made beforehand, e.g. carried in .lerobot-av1/av1: SVT-AV1 1.4's encoder hung on that machine, so the AV1
# set is generated on the development machine, where it takes ~50 s for 40 episodes, and carried: ~6 MB).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
episodes="${EPISODES:-40}"
train_steps="${TRAIN_STEPS:-40}"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { echo "== [$(el) s] $*"; }

log "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc
ff="$root/.deps/ffmpeg" spm="$root/.deps/sentencepiece"
[ -d "$ff/lib" ] && [ -d "$spm/lib" ] || { echo "lerobot-import-gpu: .deps/ffmpeg or .deps/sentencepiece missing: run scripts/pack-deps.sh and carry .deps" >&2; exit 4; }
export LD_LIBRARY_PATH="$ff/lib:$spm/lib:${LD_LIBRARY_PATH:-}"

log "build (build-gpu/)"
source scripts/dev/gpu-build.sh
gpu_build "$out" vlatune vlatune_make_lerobot || exit 1
grep -E "vlatune: (Arrow|FFmpeg|SentencePiece)" "$out/cmake.log"
vl=./build-gpu/cli/vlatune
mk=./build-gpu/tests/vlatune_make_lerobot
$vl --version

log "tokenizer (a small SentencePiece model with PaliGemma's special ids)"
python3 - <<'PY'
import sentencepiece as spm
open("/tmp/corpus.txt", "w").write("\n".join(["put the bowl on the plate", "open the drawer", "pick up the red block",
    "turn on the stove", "put both the alphabet soup and the tomato sauce in the basket"] * 50))
spm.SentencePieceTrainer.train(logstream=open("/dev/null", "w"), input="/tmp/corpus.txt", model_prefix="/tmp/tok", vocab_size=120, pad_id=0, eos_id=1,
    bos_id=2, unk_id=3, user_defined_symbols=["\n"], hard_vocab_limit=False, character_coverage=1.0)
PY
[ -f /tmp/tok.model ] || { echo "tokenizer training failed"; exit 1; }

data=/tmp/lerobot
rm -rf "$data"; mkdir -p "$data"
log "generate $episodes episodes per storage"
/usr/bin/time -f "png generator %e s" timeout 120 $mk --out "$data/png" --version v2.1 --storage image \
  --episodes "$episodes" --length 160 --length-jitter 20 --width 256 --height 256 --fps 10 > "$out/gen_png.log" 2>&1
tail -n 2 "$out/gen_png.log"
if [ -n "${AV1_DATA:-}" ]; then
  cp -r "$AV1_DATA" "$data/av1"
else
  /usr/bin/time -f "av1 generator %e s" timeout 120 $mk --out "$data/av1" --version v3.0 --storage video \
    --codec libsvtav1 --episodes "$episodes" --length 160 --length-jitter 20 --width 256 --height 256 --fps 10 \
    --episodes-per-file 20 > "$out/gen_av1.log" 2>&1
  tail -n 2 "$out/gen_av1.log"
fi
du -sh "$data/png" "$data/av1"

imp() {  # NAME SRC WORKERS [extra flags]
  local name="$1" src="$2" workers="$3"; shift 3
  rm -rf "/tmp/ds_$name"
  local s=$(date +%s.%N)
  timeout 150 $vl data import --lerobot "$src" --tokenizer /tmp/tok.model --out "/tmp/ds_$name" --workers "$workers" "$@" \
    > "$out/import_$name.log" 2>&1 || { echo "import $name failed"; tail -20 "$out/import_$name.log"; return 1; }
  local e=$(date +%s.%N)
  local frames=$(python3 -c "import json; print(json.load(open('/tmp/ds_$name/manifest.json'))['samples'])")
  local bytes=$(du -sb "/tmp/ds_$name" | cut -f1)
  python3 -c "
s, e, f, b = $s, $e, $frames, $bytes
print(f'import $name: workers $workers: {f} frames in {e - s:.1f} s = {f / (e - s):.0f} frames/s; '
      f'{b / f / 1024:.0f} KiB per frame packed; LIBERO-sized (273,465 frames): {273465 / (f / (e - s)) / 60:.1f} min, '
      f'{273465 * b / f / 2**30:.0f} GiB')" | tee -a "$out/summary.txt"
  tail -2 "$out/import_$name.log"
}
log "import, every core"
imp png "$data/png" "$(nproc)"
imp av1 "$data/av1" "$(nproc)"
log "import scaling (first 8 episodes)"
for w in 1 4; do imp "png_w$w" "$data/png" "$w" --episodes 0:8; imp "av1_w$w" "$data/av1" "$w" --episodes 0:8; done
imp "png_all_w16" "$data/png" "$(nproc)" --episodes 0:8

log "the loader alone (full size, batch 32, the trainer's default workers, and 8)"
for w in 4 8; do timeout 60 $vl data bench --data /tmp/ds_png --config full --batch 32 --steps 100 --workers $w | tee -a "$out/summary.txt"; done

log "train full size, batch 32, FP8 recipe, from the imported PNG dataset ($train_steps steps)"
rm -rf /tmp/run_fp8
timeout 240 $vl train --config full --data /tmp/ds_png --recipe recipes/pi05_libero_h200_fp8.json --batch 32 \
  --steps "$train_steps" --timing-warmup 5 --out /tmp/run_fp8 --no-progress --log-every 10 --no-save \
  > "$out/train_fp8.log" 2>&1 || { echo "train failed"; tail -30 "$out/train_fp8.log"; }
tail -5 "$out/train_fp8.log"
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open("/tmp/run_fp8/metrics.jsonl")]
rows = [r for r in rows if r.get("step", 0) > 5]
w = [r["data_wait_ms"] for r in rows]
sps = [r["samples_per_s"] for r in rows]
ms = [r["step_ms"] for r in rows]
print(f"train FP8 full b32 from the imported dataset: {len(rows)} steps after warm-up: samples/s median "
      f"{statistics.median(sps):.1f}, step {statistics.median(ms):.0f} ms, data wait median {statistics.median(w):.2f} ms "
      f"(max {max(w):.2f} ms)")
run = json.load(open("/tmp/run_fp8/run.json"))
print("run.json samples_per_s_median", run.get("samples_per_s_median"), "peak_gib", run.get("peak_gib"))
PY
cp /tmp/run_fp8/run.json "$out/run_fp8.json" 2>/dev/null
log "summary"
cat "$out/summary.txt"
