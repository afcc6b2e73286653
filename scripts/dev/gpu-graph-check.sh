# Dev A/B on one GPU: GPU tests, then `vlatune train` bf16 (batch 32, no trimming) with variants alternated; with
# PROFILE=1 also a traced profile step (kernels by module and kernel, idle gaps: kernels.txt, gaps.txt).
# Usage: [TEST_ENV="A=1"] [PROFILE=1] VARIANTS="name=ENV=V --flag value;name2=..." \
#          bash scripts/dev/gpu-graph-check.sh [TEST_SPEC]
export VLATUNE_COMMIT=${VLATUNE_COMMIT:-wip}
t0=$(date +%s)
bash scripts/gpu-check.sh --build-only > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "built $(( $(date +%s)-t0 ))s"
if [ -n "${1:-}" ]; then
  env ${TEST_ENV:-} ./build-gpu/tests/vlatune_tests_torch "$1" > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
  grep -B5 -A25 "FAILED\|threw" $OUT/tests.log | head -60
fi
echo '{"schema": "vlatune.recipe/1", "data": {"trim_text": false}}' > $OUT/notrim.json
v=build-gpu/cli/vlatune
IFS=';' read -ra vs <<< "${VARIANTS:-eager=;graph=--cuda-graph step}"
for round in 1 2; do
  for spec in "${vs[@]}"; do
    name=${spec%%=*}; rest=${spec#*=}
    envs=""; args=""
    for w in $rest; do case "$w" in *=*) envs="$envs $w" ;; *) args="$args $w" ;; esac; done
    env $envs $v train --config full --data synthetic --batch 32 --steps 12 --no-save --out $OUT/t_${name}_$round \
      --no-progress --timing-warmup 4 --recipe $OUT/notrim.json $args > $OUT/train_${name}_$round.log 2>&1
    echo "$name#$round: $(grep -E "^done:" $OUT/train_${name}_$round.log | sed 's/;.*//')"
    grep -E "rror|cuda graph: [0-9]" $OUT/train_${name}_$round.log | head -3
  done
done
grep -h "cudnn sdpa plans" $OUT/train_*_1.log | sort -u | cut -c1-400
if [ "${PROFILE:-0}" = 1 ]; then
  $v profile --config full --data synthetic --batch 32 --second-batch 1 --steps 1 --warmup 2 --timed-steps 3 \
    --ab-steps 0 --gemm-reps 0 --trace-steps 1 --out /tmp/vlatune-prof > $OUT/profile.log 2>&1
  cp /tmp/vlatune-prof/profile.json $OUT/
  python3 scripts/dev/trace_kernels.py /tmp/vlatune-prof/trace.json.gz 1 80 > $OUT/kernels.txt 2>&1
  python3 scripts/dev/trace_gaps.py /tmp/vlatune-prof/trace.json.gz > $OUT/gaps.txt 2>&1
  grep -E "^step|peak" $OUT/profile.log | head -4; head -1 $OUT/kernels.txt; head -3 $OUT/gaps.txt
fi
echo "total $(( $(date +%s)-t0 ))s"
