# The targets' vlatune-vs-reference pairs on ONE GPU (when nvidia-h200-x2 is not lent; scripts/measure-targets.sh
# is the two-GPU version): reference compiled bf16, then vlatune bf16 eager and with --cuda-graph step (no text
# trimming, the reference's work); if time is left (elapsed < ${FP8_BEFORE_S:-380} s), the FP8 pair.
# Carry [".deps", ".ref"]. Output: $OUT/bf16/ and $OUT/fp8/ (gpu-check summaries).
set -uo pipefail
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
mk() {  # SRC|none DEST KEY=JSON...
  python3 - "$@" <<'PY'
import json, sys
src, dest = sys.argv[1], sys.argv[2]
r = {"schema": "vlatune.recipe/1"} if src == "none" else json.load(open(src))
r.setdefault("data", {})["trim_text"] = False
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    r.setdefault("model_options", {})[k] = v
json.dump(r, open(dest, "w"), indent=2)
PY
}
mkdir -p "$OUT/bf16" "$OUT/fp8" /tmp/recipes
mk none /tmp/recipes/bf16_eager.json
mk none /tmp/recipes/bf16_graph.json cuda_graph=step
mk recipes/pi05_libero_h200_fp8.json /tmp/recipes/fp8_no_trim.json
OUT="$OUT/bf16" bash scripts/gpu-check.sh --skip-tests --no-ctest --bench-filter NONE_ --ref compiled --train-steps 14 \
  --train-recipes /tmp/recipes/bf16_eager.json,/tmp/recipes/bf16_graph.json > "$OUT/bf16.log" 2>&1
echo "[$(el) s] bf16 pair"; tail -6 "$OUT/bf16.log"
if [ "$(el)" -lt "${FP8_BEFORE_S:-380}" ]; then
  OUT="$OUT/fp8" bash scripts/gpu-check.sh --no-build --skip-tests --no-ctest --bench-filter NONE_ --ref compiled-fp8 \
    --train-steps 14 --train-recipes /tmp/recipes/fp8_no_trim.json > "$OUT/fp8.log" 2>&1
  echo "[$(el) s] fp8 pair"; tail -4 "$OUT/fp8.log"
fi
