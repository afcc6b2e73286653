#!/usr/bin/env bash
# The README's main-job command: set up, build, and run vlatune's pipeline on its embedded default:
# the tiny Pi0.5 config on the CPU, or the full-size model (bf16) when a GPU is visible.
# Today the pipeline is: random weights (openpi names) -> a LIBERO-shaped batch -> forward + backward with the
# exact shortcuts, gradients written for parity checks. Outputs land in out/default/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build vlatune
vlatune=build/cli/vlatune
"$vlatune" --version

if "$vlatune" --version | grep -q "^GPU: none"; then
  config=tiny dtype=fp32 batch=4
else
  config=full dtype=bf16 batch=8
fi
out=out/default
mkdir -p "$out"
echo "== $config Pi0.5, $dtype, batch $batch -> $out/"
set -x
"$vlatune" model init --config "$config" --dtype "$dtype" --seed 0 --out "$out/weights.safetensors"
"$vlatune" model batch --config "$config" --batch "$batch" --slots 3 --cameras 2 --seed 1 --out "$out/batch.safetensors"
"$vlatune" forward --config "$config" --dtype "$dtype" --weights "$out/weights.safetensors" \
  --batch "$out/batch.safetensors" --out "$out/forward.safetensors"
