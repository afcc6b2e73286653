#!/usr/bin/env bash
# Unpacks the header-only dependencies (nlohmann-json, CLI11, Catch2) and Google Benchmark (its library)
# from their Debian packages into .deps/ (ignored), for the GPU machine, which has no package access.
# Name `.deps` in the device call's `carry`. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps"
pkgs=(nlohmann-json3-dev libcli11-dev catch2 libbenchmark-dev libbenchmark1debian)
if [ -f "$dest/.complete" ]; then exit 0; fi
rm -rf "$dest"; mkdir -p "$dest/debs" "$dest/root"
(cd "$dest/debs" && apt-get download "${pkgs[@]}" >/dev/null 2>&1)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
rm -rf "$dest/debs" "$dest/root/usr/share/doc" "$dest/root/usr/share/man"
touch "$dest/.complete"
echo "pack-deps: $(du -sh "$dest" | cut -f1) in $dest"
