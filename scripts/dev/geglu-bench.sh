set -uo pipefail
bash scripts/gpu-check.sh --build-only > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
./build-gpu/tests/vlatune_tests_torch "The CUDA GeGLU kernels*" > $OUT/tests.log 2>&1; tail -2 $OUT/tests.log
for k in grid-stride streaming grid-stride streaming; do
  VLATUNE_GEGLU_KERNEL=$k ./build-gpu/bench/vlatune_bench --benchmark_filter='BM_fused_geglu/fused:1' \
    --benchmark_repetitions=5 --benchmark_report_aggregates_only=true 2>&1 | grep median | sed "s/^/$k /" | cut -c1-110
done
