#!/usr/bin/env bash
# The LayerNorm backward of a base commit, the working tree and variants of the tree's tile constants, on one GPU:
# grad_x compared byte for byte with the base, the weight/bias gradients within 1e-5, CUDA-event times per launch at
# SigLIP's batch-32 shape and a few others (scripts/dev/layer_norm_ab.cu). A table; exit 1 when an output differs.
#
#   git show BASE:kernels/layer_norm.cu > .ref/layer_norm_base.cu
#   device run: command "VARIANTS='mb4:kBwdWarpMinBlocks=4' bash scripts/dev/layer-norm-ab-gpu.sh", carry [".ref"]
# VARIANTS: space-separated NAME:CONSTANT=VALUE, each the tree's kernels/layer_norm.cu with `constexpr int CONSTANT`
# set to VALUE. The base is compiled against the tree's headers. ARCH: the GPU architecture (default sm_90a).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
base="${BASE_FILE:-.ref/layer_norm_base.cu}"
[ -f "$base" ] || { echo "no base kernels at $base: git show BASE:kernels/layer_norm.cu > $base" >&2; exit 2; }
work="$(mktemp -d)"
flags=(-std=c++17 -O3 -arch="${ARCH:-sm_90a}" -I"$root" --expt-relaxed-constexpr)
names=(base tree)
sources=("$base" kernels/layer_norm.cu)
for v in ${VARIANTS:-}; do
  name="${v%%:*}" assignment="${v#*:}"
  constant="${assignment%%=*}" value="${assignment#*=}"
  [[ "$name" =~ ^[a-z][a-z0-9_]*$ ]] || { echo "variant name '$name': lower-case letters, digits, _" >&2; exit 2; }
  sed -E "s/constexpr int $constant = [^;]*;/constexpr int $constant = $value;/" kernels/layer_norm.cu >"$work/$name.cu"
  grep -q "constexpr int $constant = $value;" "$work/$name.cu" || { echo "no 'constexpr int $constant' in kernels/layer_norm.cu" >&2; exit 2; }
  names+=("$name")
  sources+=("$work/$name.cu")
done
pids=()
xmacro=""
for i in "${!names[@]}"; do
  name="${names[$i]}"
  xmacro+="X($name) "
  nvcc "${flags[@]}" -Dvlatune="vlatune_$name" -x cu -c "${sources[$i]}" -o "$work/${name}_kernels.o" & pids+=($!)
  nvcc "${flags[@]}" -Dvlatune="vlatune_$name" -DLAYER_NORM_AB_API="$name" -c scripts/dev/layer_norm_ab.cu \
    -o "$work/${name}_api.o" & pids+=($!)
done
nvcc "${flags[@]}" -DLAYER_NORM_AB_X="$xmacro" -c scripts/dev/layer_norm_ab.cu -o "$work/driver.o" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid" || { echo "a compile failed (above)" >&2; exit 2; }; done
nvcc -arch="${ARCH:-sm_90a}" "$work"/*.o -o "$work/layer_norm_ab"
out="${OUT:-$root/out}"
mkdir -p "$out"
"$work/layer_norm_ab" | tee "$out/layer_norm_ab.txt"
