// Google Benchmark main for vlatune_bench. Run on the GPU machine through scripts/gpu-check.sh:
//   vlatune_bench --benchmark_repetitions=10 --benchmark_out=bench.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
