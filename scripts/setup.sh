#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine needs to build and test vlatune, idempotently:
# Debian packages (headers, test/bench libraries, optional HDF5/SentencePiece/FFmpeg, chromium for the report test)
# and torch==2.11.0 from PyPI into the project virtual environment (LibTorch comes from that wheel), the
# header-only cudnn_frontend and pyarrow (Arrow/Parquet C++) from PyPI, openpi-client in a venv of its own, and the
# trace/event readers the tests check our output with (Holistic Trace Analysis, TensorBoard) in another.
# A second run checks and returns in seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch_version="${VLATUNE_TORCH_VERSION:-2.11.0}"
# The venv lives outside the checkout so every clone on this machine (CI included) shares one torch install.
venv="${VLATUNE_VENV:-$HOME/.cache/vlatune/venv-torch-$torch_version}"

debs=(build-essential cmake ninja-build ccache git pkg-config python3-venv
      nlohmann-json3-dev libcli11-dev catch2 libbenchmark-dev
      libhdf5-dev libsentencepiece-dev sentencepiece zlib1g-dev
      libavformat-dev libavcodec-dev libswscale-dev libavutil-dev  # FFmpeg: LeRobot frames and videos (data import)
      libgloo-dev  # Gloo's headers: the CPU process group of the data-parallel tests (trainer/distributed.h)
      libprotobuf-dev protobuf-compiler libisal-dev  # TensorBoard event files: Event/Summary messages, CRC32C
      libwebsocketpp-dev libasio-dev libmsgpack-cxx-dev  # `vlatune serve` (openpi's websocket policy protocol)
      libdav1d-dev libsvtav1enc-dev libx264-dev nasm  # only for pack-deps.sh's minimal FFmpeg build (.deps/ffmpeg)
      chromium)  # chromium: headless screenshot test of `vlatune report`'s HTML (tests/core)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
fi
have="$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
if [ "${have%%+*}" != "$torch_version" ]; then
  echo "setup: installing torch==$torch_version into $venv (large download, once)"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "torch==$torch_version" numpy
fi
# cudnn_frontend: header-only C++ (the wheel's include/), for the joint attention's cuDNN kernels
# (kernels/cudnn_sdpa.h). --no-deps: cuDNN itself is the copy torch already brought.
frontend_version="${VLATUNE_CUDNN_FRONTEND_VERSION:-1.32.0}"
have_frontend="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("nvidia-cudnn-frontend"))' \
                 2>/dev/null || true)"
if [ "$have_frontend" != "$frontend_version" ]; then
  echo "setup: installing nvidia-cudnn-frontend==$frontend_version into $venv"
  # Optional: without it the build still works, the joint attention then runs FlashAttention-2 (slower).
  "$venv/bin/pip" install -q --no-deps "nvidia-cudnn-frontend==$frontend_version" ||
    echo "setup: WARNING: nvidia-cudnn-frontend not installed; the cuDNN attention kernels will be left out" >&2
fi
# pyarrow: its wheel carries Arrow/Parquet C++ (headers and libraries) for LeRobot's parquet tables, as the torch
# wheel carries LibTorch. Optional: without it `vlatune data import --lerobot` reports that it is unavailable.
pyarrow_version="${VLATUNE_PYARROW_VERSION:-26.0.1}"
have_pyarrow="$("$venv/bin/python" -c 'import pyarrow; print(pyarrow.__version__)' 2>/dev/null || true)"
if [ "$have_pyarrow" != "$pyarrow_version" ]; then
  echo "setup: installing pyarrow==$pyarrow_version into $venv"
  "$venv/bin/pip" install -q "pyarrow==$pyarrow_version" ||
    echo "setup: WARNING: pyarrow not installed; LeRobot import will be left out" >&2
fi
# The readers our output is checked against, in a venv of their own: Holistic Trace Analysis opens trace.json.gz
# and TensorBoard's own event reader reads the event files `train` writes (tests/core/trace_readers.h, used by
# test_formats_tensorboard.cpp and test_profiler_trace_export.cpp). Recorded in .vlatune/trace-readers-python.
hta_version="${VLATUNE_HTA_VERSION:-0.5.0}"
tensorboard_version="${VLATUNE_TENSORBOARD_VERSION:-2.21.0}"
readers_venv="${VLATUNE_TRACE_READERS_VENV:-$HOME/.cache/vlatune/venv-trace-readers}"
have_readers="$("$readers_venv/bin/python" -c 'import importlib.metadata as m
import hta.trace_analysis, tensorboard.backend.event_processing.event_accumulator
print(m.version("HolisticTraceAnalysis"), m.version("tensorboard"))' 2>/dev/null || true)"
if [ "$have_readers" != "$hta_version $tensorboard_version" ]; then
  echo "setup: installing HolisticTraceAnalysis==$hta_version tensorboard==$tensorboard_version into $readers_venv"
  mkdir -p "$(dirname "$readers_venv")"
  [ -x "$readers_venv/bin/python" ] || /usr/bin/python3 -m venv "$readers_venv"
  "$readers_venv/bin/pip" install -q "HolisticTraceAnalysis==$hta_version" "tensorboard==$tensorboard_version"
fi
# openpi-client (pure Python; pins numpy<2) in a venv of its own, for the test that drives `vlatune serve` with
# openpi's real client (tests/torch/test_serve_policy_server.cpp). Recorded in .vlatune/openpi-client-python.
client_version="${VLATUNE_OPENPI_CLIENT_VERSION:-0.1.2}"
client_venv="${VLATUNE_OPENPI_CLIENT_VENV:-$HOME/.cache/vlatune/venv-openpi-client}"
have_client="$("$client_venv/bin/python" -c 'import importlib.metadata as m
from openpi_client import websocket_client_policy
print(m.version("openpi-client"))' 2>/dev/null || true)"
if [ "$have_client" != "$client_version" ]; then
  echo "setup: installing openpi-client==$client_version into $client_venv"
  mkdir -p "$(dirname "$client_venv")"
  [ -x "$client_venv/bin/python" ] || /usr/bin/python3 -m venv "$client_venv"
  # typing_extensions: websocket_client_policy imports it, but 0.1.2 does not declare it.
  "$client_venv/bin/pip" install -q "openpi-client==$client_version" typing_extensions
fi
# Record the interpreters so CMake finds torch through one and never through PATH's python3.
mkdir -p "$root/.vlatune"
echo "$venv/bin/python" > "$root/.vlatune/python"
echo "$readers_venv/bin/python" > "$root/.vlatune/trace-readers-python"
echo "$client_venv/bin/python" > "$root/.vlatune/openpi-client-python"
echo "setup: ok (torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
