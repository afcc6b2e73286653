# One-GPU A/B of the GeGLU kernels (VLATUNE_GEGLU_KERNEL=grid-stride vs the default streaming kernels): the GPU
# GeGLU/GELU tests, BM_fused_geglu both ways, the reference's compiled bf16 run, then `vlatune train` bf16 (batch 32,
# no trimming, 14 steps) alternating the two, twice. Carry [".deps", ".ref"].
set -uo pipefail
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
bash scripts/gpu-check.sh --build-only > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "[$(el) s] built"
./build-gpu/tests/vlatune_tests_torch "The CUDA GeGLU kernels*,The CUDA GELU kernels*,[gpu][optimizer]" > $OUT/tests.log 2>&1
tail -2 $OUT/tests.log; grep -B3 -A20 FAILED $OUT/tests.log | head -40
for k in grid-stride streaming; do
  VLATUNE_GEGLU_KERNEL=$k ./build-gpu/bench/vlatune_bench --benchmark_filter='BM_fused_geglu/fused:1' \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true 2>&1 | grep median | sed "s/^/$k /"
done
python3 .ref/pi05_torch_reference.py --slots 2 --attn sdpa --recompute vit --compile layer --steps 10 --warmup 3 \
  --tag compiled 2>&1 | grep RESULT > $OUT/reference.jsonl; echo "[$(el) s] reference: $(cut -c1-200 $OUT/reference.jsonl)"
echo '{"schema": "vlatune.recipe/1", "data": {"trim_text": false}}' > $OUT/notrim.json
for round in 1 2; do
  for k in grid-stride streaming; do
    VLATUNE_GEGLU_KERNEL=$k build-gpu/cli/vlatune train --config full --data synthetic --batch 32 --steps 14 --no-save \
      --out $OUT/t_${k}_$round --no-progress --recipe $OUT/notrim.json > $OUT/train_${k}_$round.log 2>&1
    echo "[$(el) s] $k#$round: $(grep -E '^done:' $OUT/train_${k}_$round.log | sed 's/;.*//')"
  done
done
