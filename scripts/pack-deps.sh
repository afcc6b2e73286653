#!/usr/bin/env bash
# Unpacks the header-only dependencies (nlohmann-json, CLI11, Catch2) and Google Benchmark (its library)
# from their Debian packages, and cudnn_frontend's headers from the venv, into .deps/ (ignored), for the GPU
# machine, which has no package access.
# Name `.deps` in the device call's `carry`. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps"
pkgs=(nlohmann-json3-dev libcli11-dev catch2 libbenchmark-dev libbenchmark1debian)
# cudnn_frontend's headers (header-only) from the venv scripts/setup.sh filled; the GPU machine has cuDNN itself.
pack_frontend() {
  local python site
  python="$(cat "$root/.vlatune/python" 2>/dev/null || true)"
  [ -n "$python" ] || { echo "pack-deps: run scripts/setup.sh first (no .vlatune/python)" >&2; return 1; }
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  [ -f "$site/include/cudnn_frontend.h" ] || { echo "pack-deps: no cudnn_frontend.h in $site/include" >&2; return 1; }
  rm -rf "$dest/cudnn_frontend"; mkdir -p "$dest/cudnn_frontend/include"
  cp -r "$site"/include/cudnn_frontend* "$site/include/cudnn_backend_base.h" "$dest/cudnn_frontend/include/"
}
mkdir -p "$dest"
[ -f "$dest/cudnn_frontend/include/cudnn_frontend.h" ] || pack_frontend
if [ -f "$dest/.complete" ]; then exit 0; fi
rm -rf "$dest/debs" "$dest/root"; mkdir -p "$dest/debs" "$dest/root"
(cd "$dest/debs" && apt-get download "${pkgs[@]}" >/dev/null 2>&1)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
rm -rf "$dest/debs" "$dest/root/usr/share/doc" "$dest/root/usr/share/man"
touch "$dest/.complete"
echo "pack-deps: $(du -sh "$dest" | cut -f1) in $dest"
