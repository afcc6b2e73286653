#!/usr/bin/env bash
# The README's main-job command: set up, build, and run vlatune's whole product chain as a user would, on its
# embedded default: the tiny Pi0.5 config on the CPU, or the full-size model (bf16) when a GPU is visible.
#   a LeRobot dataset made for the purpose (v2.1, PNG frames, two cameras; by the test fixture generator
#   vlatune_make_lerobot) and a small SentencePiece tokenizer -> vlatune data import (2 episodes held out)
#   -> vlatune profile -> vlatune plan -> vlatune train --recipe, evaluating on the held-out split every 10 steps
#   -> vlatune eval (the held-out split, the final weights)
#   -> vlatune sample -> vlatune report
# Where the build cannot write LeRobot datasets (no Arrow or FFmpeg), a synthetic packed dataset stands in for the
# import. Outputs land in out/default/ (replaced on every run); the last lines say where each one is.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=(vlatune)
if ninja -C build -t targets all | grep '^vlatune_make_lerobot:' >/dev/null; then targets+=(vlatune_make_lerobot); fi
ninja -C build "${targets[@]}"
vlatune=build/cli/vlatune
"$vlatune" --version

out=out/default
rm -rf "$out"
mkdir -p "$out"
if "$vlatune" --version | grep -q "^GPU: none"; then
  config=tiny dtype=fp32 side=28 batch=4 steps=20 width=64 height=48 budget=(--memory-budget 16)
else
  config=full dtype=bf16 side=224 batch=8 steps=20 width=320 height=240 budget=()
fi
echo "== $config Pi0.5, $dtype -> $out/"

# A tokenizer for the prompts (PaliGemma's special ids: pad 0, eos 1, bos 2, unk 3). A real run uses PaliGemma's
# own tokenizer.model; this small one keeps the ids inside the tiny config's 512-entry vocabulary.
for i in $(seq 1 40); do
  echo "put the black bowl $i on the plate"
  echo "open the top drawer and put the bowl inside"
  echo "pick up the alphabet soup and place it in the basket"
done >"$out/corpus.txt"
spm_train --input="$out/corpus.txt" --model_prefix="$out/tokenizer" --vocab_size=100 --hard_vocab_limit=false \
  --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 >"$out/tokenizer.log" 2>&1

set -x
if [ -x build/tests/vlatune_make_lerobot ]; then
  build/tests/vlatune_make_lerobot --out "$out/lerobot" --version v2.1 --storage image --episodes 12 --length 24 \
    --width "$width" --height "$height" --cameras image,wrist_image --state-dim 8 --action-dim 7 --seed 0 \
    >"$out/lerobot.log"
  "$vlatune" data import --lerobot "$out/lerobot" --tokenizer "$out/tokenizer.model" --out "$out/data" \
    --val-episodes 2 --horizon 10 --image-side "$side"
  eval_data="$out/data/val"
else
  "$vlatune" data synth --config "$config" --samples 256 --seed 0 --horizon 10 --out "$out/data"
  "$vlatune" data synth --config "$config" --samples 32 --seed 1 --horizon 10 --out "$out/val"
  eval_data="$out/val"
fi
"$vlatune" profile --config "$config" --data "$out/data" --batch "$batch" --steps 2 --warmup 1 --timed-steps 3 \
  --ab-steps 1 --gemm-reps 2 --out "$out/profile"
"$vlatune" plan --profile "$out/profile/profile.json" "${budget[@]}" --batch "$batch" --out "$out/recipe.json"
"$vlatune" train --config "$config" --data "$out/data" --recipe "$out/recipe.json" --steps "$steps" \
  --out "$out/run" --lr 1e-4 --warmup-steps 5 --checkpoint-every 10 --log-every 5 --no-progress \
  --eval-data "$eval_data" --eval-every 10 --eval-batches 2
"$vlatune" eval --config "$config" --dtype "$dtype" --weights "$out/run/final" --data "$eval_data" --batch 4 \
  >"$out/eval.json"
"$vlatune" model batch --config "$config" --batch 1 --slots 3 --cameras 2 --horizon 10 --seed 1 \
  --out "$out/observation.safetensors"
"$vlatune" sample --config "$config" --dtype "$dtype" --weights "$out/run/final" \
  --batch "$out/observation.safetensors" --out "$out/actions.safetensors" >"$out/sample.json"
"$vlatune" report --profile "$out/profile/profile.json" --recipe "$out/recipe.json" --run "$out/run" \
  --out "$out/report.html"
set +x
cat <<EOF
== done: $config Pi0.5 on $("$vlatune" --version | grep '^GPU:')
dataset       $out/data (imported; held-out split: $eval_data)
profile       $out/profile/profile.json (trace: $out/profile/trace.json.gz)
recipe        $out/recipe.json
training run  $out/run (metrics.jsonl with held-out evaluation rows, run.json, checkpoints; weights and norm stats
              in $out/run/final)
evaluation    $out/eval.json: $(cat "$out/eval.json")
actions       $out/actions.safetensors (actions [1, 10, 32]; actions_real in the dataset's units): $(cat "$out/sample.json")
report        $out/report.html
EOF
