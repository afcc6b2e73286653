#!/usr/bin/env bash
# The FP8 cast kernels of a base commit beside the working tree's, on one GPU: every output of every launch compared
# byte for byte (GeGLU forward with and without e4m3 blocks and transposed copy, GeGLU backward from blocks and from
# bf16, the plain cast in e4m3 and e5m2; bf16 and fp32, shapes with partial tiles), then CUDA-event times at the
# backbone's batch-32 shapes. A table of base / tree ratios; exit 1 when any byte differs.
#
#   git show BASE:kernels/fp8_quant.cu > .ref/fp8_quant_base.cu     (here: the device copy's git history can lag)
#   device run: command "bash scripts/dev/fp8-cast-ab-gpu.sh", carry [".ref"]
# The base file is compiled against the tree's headers (kernels/fp8.h's params must not have changed since BASE),
# or, with BASE_INCLUDE set, against that root's first (the base commit's device headers, when they changed:
#   mkdir -p .ref/base_root && git archive BASE kernels | tar -x -C .ref/base_root).
# BASE_FILE overrides the base file's path; ARCH the GPU architecture (default sm_90a).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
base="${BASE_FILE:-.ref/fp8_quant_base.cu}"
[ -f "$base" ] || { echo "no base kernels at $base: git show BASE:kernels/fp8_quant.cu > $base" >&2; exit 2; }
work="$(mktemp -d)"
flags=(-std=c++17 -O3 -arch="${ARCH:-sm_90a}" -I"$root" --expt-relaxed-constexpr)
# The base kernels and their C entry points in namespace vlatune_base; the tree's kernels and the driver as built.
pids=()
base_flags=("${flags[@]}")
[ -n "${BASE_INCLUDE:-}" ] && base_flags=(-I"$BASE_INCLUDE" "${flags[@]}")
nvcc "${base_flags[@]}" -Dvlatune=vlatune_base -x cu -c "$base" -o "$work/base_kernels.o" & pids+=($!)
nvcc "${flags[@]}" -Dvlatune=vlatune_base -DFP8_CAST_AB_BASE_API -c scripts/dev/fp8_cast_ab.cu -o "$work/base_api.o" &
pids+=($!)
nvcc "${flags[@]}" -c kernels/fp8_quant.cu -o "$work/tree_kernels.o" & pids+=($!)
nvcc "${flags[@]}" -c scripts/dev/fp8_cast_ab.cu -o "$work/driver.o" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid" || { echo "a compile failed (above)" >&2; exit 2; }; done
nvcc -arch="${ARCH:-sm_90a}" "$work"/{base_kernels,base_api,tree_kernels,driver}.o -o "$work/fp8_cast_ab"
out="${OUT:-$root/out}"
mkdir -p "$out"
"$work/fp8_cast_ab" | tee "$out/fp8_cast_ab.txt"
