#!/usr/bin/env bash
# The README's main-job command: set up, build, and run vlatune's pipeline on its embedded default:
# the tiny Pi0.5 config on the CPU, or the full-size model (bf16) when a GPU is visible.
# Today the pipeline is: random weights (openpi names) -> a LIBERO-shaped batch -> forward + backward with the
# exact shortcuts (gradients written for parity checks) -> a packed dataset -> a short training run with
# checkpoints, metrics.jsonl and run.json. Outputs land in out/default/ (replaced on every run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build vlatune
vlatune=build/cli/vlatune
"$vlatune" --version

out=out/default
rm -rf "$out"
mkdir -p "$out"
if "$vlatune" --version | grep -q "^GPU: none"; then
  config=tiny dtype=fp32 batch=4 train_batch=8 data="$out/data"
  "$vlatune" data synth --config tiny --samples 256 --seed 0 --out "$data"
else
  # Full size at the benchmark setting: batches made on the GPU, the SigLIP layers recomputed.
  config=full dtype=bf16 batch=8 train_batch=32 data=synthetic
fi
cat >"$out/recipe.json" <<'JSON'
{"schema": "vlatune.recipe/1",
 "recompute": {"modules": ["paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.*"]}}
JSON
echo "== $config Pi0.5, $dtype -> $out/"
set -x
"$vlatune" model init --config "$config" --dtype "$dtype" --seed 0 --out "$out/weights.safetensors"
"$vlatune" model batch --config "$config" --batch "$batch" --slots 3 --cameras 2 --seed 1 --out "$out/batch.safetensors"
"$vlatune" forward --config "$config" --dtype "$dtype" --weights "$out/weights.safetensors" \
  --batch "$out/batch.safetensors" --out "$out/forward.safetensors"
"$vlatune" train --config "$config" --data "$data" --batch "$train_batch" --steps 20 --recipe "$out/recipe.json" \
  --out "$out/run" --lr 1e-4 --warmup-steps 5 --checkpoint-every 10 --log-every 5
