#!/usr/bin/env bash
# Action-chunk latency on one GPU, the setting of the inference target (<= 20 ms per chunk, median): full-size
# Pi0.5 in bf16 with random weights, batch 1, two cameras, a 20-token prompt padded to 200 tokens, horizon 10,
# 10 Euler steps. Measures, in this order:
#   1. the sampling tests ("[sample]", CPU and GPU: graph replay equals eager, bf16 close to fp32);
#   2. `vlatune sample --bench 50`, eager and with --cuda-graph: median ms per chunk and the vision / prefix /
#      suffix (10 steps) split;
#   3. `vlatune profile --inference`: per-module time of one chunk (profile.json, trace.json.gz);
#   4. `vlatune serve --cuda-graph` and openpi's client: median round trip over 50 requests of 224 x 224 images;
#   5. the table: median ms per chunk eager and graphed, its vision / prefix / suffix split, the round trip.
# Everything lands in $OUT (summary.txt); the table of step 5 is printed last.
#
# Development machine, once: pack the headers and wheels the GPU machine cannot download, then call the device:
#   bash scripts/pack-deps.sh && bash scripts/dev/inference-latency-gpu.sh --pack
#   device run: command "bash scripts/dev/inference-latency-gpu.sh", carry [".deps", ".whl"]
# --pack adds to .deps/serve/ the websocketpp, Asio and msgpack-cxx headers and a small SentencePiece tokenizer,
# and to .whl/openpi-client/ openpi-client 0.1.2 with msgpack and websockets for CPython 3.10-3.13 (under 3 MB;
# numpy is the GPU machine's own). The last lines printed are the latency table.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

if [ "${1:-}" = "--pack" ]; then
  set -e
  dest="$root/.deps/serve"
  rm -rf "$dest" && mkdir -p "$dest/include"
  cp -r /usr/include/websocketpp /usr/include/asio /usr/include/asio.hpp /usr/include/msgpack /usr/include/msgpack.hpp \
    "$dest/include/"
  corpus="$(mktemp)"
  for i in $(seq 1 50); do
    echo "put both the alphabet soup and the tomato sauce in the basket"
    echo "open the top drawer and put the bowl inside; pick up the black bowl $i and place it on the plate"
  done >"$corpus"
  spm_train --input="$corpus" --model_prefix="$dest/tokenizer" --vocab_size=120 --hard_vocab_limit=false \
    --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 --user_defined_symbols=$'\n' >/dev/null 2>&1
  rm -f "$corpus"
  # openpi-client's own wheels, small: numpy comes from the GPU machine's python3 (its venv sees the system site
  # packages) when it has one; VLATUNE_PACK_NUMPY=3.12 adds the numpy<2 wheel for that Python version (~18 MB: one
  # version only, to stay inside the device tool's 64 MiB carry).
  wheels="$root/.whl/openpi-client"
  rm -rf "$wheels" && mkdir -p "$wheels"
  pip_download() { "$(cat "$root/.vlatune/python")" -m pip download -q --no-deps -d "$wheels" "$@"; }
  pip_download openpi-client==0.1.2 typing_extensions
  for py in 3.10 3.11 3.12 3.13; do
    extra=()
    [ "${VLATUNE_PACK_NUMPY:-}" = "$py" ] && extra=("numpy<2")
    pip_download --only-binary=:all: --python-version "$py" --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 msgpack "websockets>=11" "${extra[@]}"
  done
  echo "packed: $dest, $wheels"
  exit 0
fi

out="${OUT:-$root/out}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
[ -d .deps/serve/include/websocketpp ] || { echo "inference-latency: no .deps/serve: run --pack first" >&2; exit 4; }

t0=$(date +%s)
spm="$root/.deps/sentencepiece"
[ -d "$spm/lib" ] || { echo "inference-latency: no .deps/sentencepiece: run scripts/pack-deps.sh" >&2; exit 4; }
export LD_LIBRARY_PATH="$spm/lib:${LD_LIBRARY_PATH:-}"
source scripts/dev/gpu-build.sh
gpu_build "$out" vlatune vlatune_tests_torch || exit 1
grep -E "vlatune: (policy server|websocketpp|SentencePiece)" "$out/cmake.log" | tee -a "$summary"
note "built in $(( $(date +%s) - t0 ))s"
v=build-gpu/cli/vlatune
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$summary"

./build-gpu/tests/vlatune_tests_torch "[sample]" >"$out/tests.log" 2>&1
note "GPU sampling tests: $(tail -2 "$out/tests.log" | tr '\n' ' ')"

$v model batch --config full --batch 1 --slots 3 --cameras 2 --text-len 200 --prompt-len 20:20 --horizon 10 \
  --seed 1 --out "$out/batch.safetensors" >/dev/null
for mode in eager graph; do
  flags=""; [ "$mode" = graph ] && flags="--cuda-graph"
  $v sample --config full --dtype bf16 --batch "$out/batch.safetensors" --bench 50 $flags \
    >"$out/sample_$mode.json" 2>"$out/sample_$mode.err"
  note "sample ($mode): $(cat "$out/sample_$mode.json")"
done

$v profile --inference --config full --warmup 3 --timed-steps 10 --steps 3 --trace-steps 1 --gemm-reps 0 \
  --out "$out/profile_inference" >"$out/profile_inference.log" 2>&1
note "profile --inference: $(grep -E 'step|attributed' "$out/profile_inference.log" | tail -1)"
python3 - "$out/profile_inference/profile.json" <<'PY' | tee -a "$summary"
import json, sys
p = json.load(open(sys.argv[1]))
b = p["batches"][0]
print(f"chunk {b['step_ms']:.2f} ms (median, untraced); GPU time by top-level part:")
rows = {m["fqn"]: m for m in b["modules"]}
parts = {
    "vision (SigLIP + projector)": ["paligemma_with_expert.paligemma.model.vision_tower",
                                    "paligemma_with_expert.paligemma.model.multi_modal_projector"],
    "prefix (backbone layers)": [f for f in rows if f.startswith("paligemma_with_expert.paligemma.model.language_model.layers.") and f.count(".") == 5],
    "suffix (expert layers, all steps)": [f for f in rows if f.startswith("paligemma_with_expert.gemma_expert.model.layers.") and f.count(".") == 4],
    "heads and inputs": ["action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out", "<inputs>"],
}
for name, fqns in parts.items():
    print(f"  {name}: {sum(rows[f]['forward_ms'] for f in fqns if f in rows):.2f} ms")
PY

# The openpi client round trip: server with the graph, 224 x 224 images resized by the server (none needed).
client_venv=/tmp/vlatune-openpi-client
if [ ! -x "$client_venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$client_venv" && "$client_venv/bin/pip" install -q --no-index --no-deps \
    --find-links .whl/openpi-client openpi-client typing_extensions msgpack websockets >"$out/client_venv.log" 2>&1
  "$client_venv/bin/python" -c "import numpy" 2>/dev/null ||
    "$client_venv/bin/pip" install -q --no-index --find-links .whl/openpi-client "numpy<2" >>"$out/client_venv.log" 2>&1
fi
python3 - "$out/norm_stats.json" <<'PY'
import json, sys
stats = lambda n: {"q01": [-1.0] * n, "q99": [1.0] * n}
json.dump({"norm_stats": {"actions": stats(7), "state": stats(8)}}, open(sys.argv[1], "w"))
PY
$v serve --config full --dtype bf16 --cuda-graph --norm-stats "$out/norm_stats.json" \
  --tokenizer .deps/serve/tokenizer.model --port 0 >"$out/serve.out" 2>"$out/serve.err" &
server=$!
port=""
for _ in $(seq 1 600); do
  port="$(grep -oE 'ws://127.0.0.1:[0-9]+' "$out/serve.out" 2>/dev/null | head -1 | sed 's/.*://')"
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.5
done
if [ -n "$port" ]; then
  timeout 300 "$client_venv/bin/python" scripts/dev/openpi_client_latency.py "$port" 50 224 \
    >"$out/client.json" 2>"$out/client.err"
  note "openpi client round trip: $(cat "$out/client.json")"
else
  note "serve did not start: $(tail -5 "$out/serve.err")"
fi
kill -TERM "$server" 2>/dev/null; wait "$server"
note "serve exit $?; $(tail -1 "$out/serve.err")"
note "total $(( $(date +%s) - t0 ))s"

# The table last: median ms per action chunk at batch 1 (full size, bf16, two cameras, 200-token prompt, 10 steps).
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return {}
def ms(d, key):
    return f"{d[key]:.2f}" if isinstance(d.get(key), (int, float)) else "n/a"
rows = [("vlatune sample, eager", load("sample_eager.json").get("bench", {})),
        ("vlatune sample, --cuda-graph", load("sample_graph.json").get("bench", {}))]
print("| path | chunk ms (median) | vision | prefix | suffix (10 steps) |")
print("|---|---|---|---|---|")
for name, b in rows:
    print(f"| {name} | {ms(b, 'chunk_ms_median')} | {ms(b, 'vision_ms_median')} | {ms(b, 'prefix_ms_median')} "
          f"| {ms(b, 'suffix_ms_median')} |")
c = load("client.json")
print(f"| openpi client -> vlatune serve --cuda-graph, round trip (224 x 224 images) | {ms(c, 'round_trip_ms_median')} "
      f"| server infer {ms(c, 'server_infer_ms_median')} | | |")
print("target: <= 20 ms per chunk (median, inside vlatune sample/serve, network excluded)")
PY
