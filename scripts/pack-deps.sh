#!/usr/bin/env bash
# Unpacks the header-only dependencies (nlohmann-json, CLI11, Catch2), Google Benchmark (its library), protobuf
# (headers, protoc, static protobuf-lite) and ISA-L from their Debian packages, and cudnn_frontend's headers from
# the venv, into .deps/ (ignored), for the GPU machine, which has no package access. Also:
#   .deps/ffmpeg/         a minimal shared FFmpeg (avformat/avcodec/swscale/avutil: mov/mp4, H.264/HEVC/PNG/MJPEG
#                         decode, AV1 via libdav1d, libsvtav1/libx264/png encode) built from Debian's own ffmpeg
#                         source package (same 5.1.x as libavcodec-dev), with libdav1d/libSvtAv1Enc/libx264 copied
#                         beside it; every library finds its siblings through RUNPATH $ORIGIN.
#   .deps/sentencepiece/  Debian's libsentencepiece (headers, libraries).
# Both have relocatable pkg-config files (prefix=${pcfiledir}/../..): on the GPU machine use
#   PKG_CONFIG_PATH=$PWD/.deps/ffmpeg/lib/pkgconfig:$PWD/.deps/sentencepiece/lib/pkgconfig
# Name `.deps` in the device call's `carry`. Idempotent: each part has its own marker and is skipped once done
# (.deps/.complete: the Debian packages; .deps/ffmpeg/.complete; .deps/sentencepiece/.complete); delete a
# marker (or the folder) to redo that part.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps"
# protobuf: headers, protoc (with the libraries it runs on) and the static protobuf-lite that the TensorBoard
# event-file writer links; ISA-L: its CRC32C (a shared library, found through the binary's build RPATH).
pkgs=(nlohmann-json3-dev libcli11-dev catch2 libbenchmark-dev libbenchmark1debian
      libprotobuf-dev protobuf-compiler libprotoc32 libprotobuf32 libprotobuf-lite32 libisal-dev libisal2)
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
# --- Shared helpers of the ffmpeg and sentencepiece parts --------------------------------------------------------
cache="${XDG_CACHE_HOME:-$HOME/.cache}/vlatune/pack-deps"  # downloaded sources, kept between runs
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"
# Makes every .pc file in $1 relocatable: prefix=${pcfiledir}/../.., the rest relative to ${prefix}.
relocate_pc() {
  local pc
  for pc in "$1"/*.pc; do
    # shellcheck disable=SC2016  # the ${...} are pkg-config's, not the shell's
    sed -i -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
        -e 's|^libdir=.*|libdir=${prefix}/lib|' -e 's|^includedir=.*|includedir=${prefix}/include|' "$pc"
    if grep -v '^prefix=' "$pc" | grep -q '=/\|-[IL]/'; then
      echo "pack-deps: $pc still names an absolute path" >&2; return 1
    fi
  done
}
need_debs() {  # fails naming the Debian packages of "$@" that are not installed
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  echo "pack-deps: missing Debian packages: ${missing[*]} (scripts/setup.sh installs them)" >&2; return 1
}

# --- .deps/ffmpeg: a minimal shared FFmpeg from Debian's own ffmpeg source package --------------------------------
ffmpeg_build_debs=(libdav1d-dev libsvtav1enc-dev libx264-dev zlib1g-dev nasm pkg-config dpkg-dev)
# shellcheck disable=SC2054  # the commas are configure's
ffmpeg_configure=(
  --enable-shared --disable-static --enable-pic --disable-debug
  --disable-programs --disable-doc --disable-everything --disable-network --disable-autodetect
  --disable-avdevice --disable-avfilter --disable-swresample --disable-postproc
  --enable-avformat --enable-avcodec --enable-swscale
  --enable-gpl --enable-zlib --enable-libdav1d --enable-libsvtav1 --enable-libx264
  --enable-protocol=file --enable-demuxer=mov --enable-muxer=mp4,mov
  --enable-decoder=h264,hevc,png,mjpeg,libdav1d --enable-encoder=png,libsvtav1,libx264
  --enable-parser=h264,hevc,av1,png,mjpeg
  --enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,av1_frame_split,extract_extradata
)
# Fetches the source package of ffmpeg $1, the version of libavcodec-dev (so code compiled against Debian's headers
# matches) into $cache/ffmpeg-src/<version>/; adds a deb-src entry to apt's sources first where none exists.
fetch_ffmpeg_source() {
  local version="$1" dir="$cache/ffmpeg-src/$1" list=/etc/apt/sources.list.d/vlatune-deb-src.sources
  ls "$dir"/*.dsc >/dev/null 2>&1 && return 0
  if ! grep -rqsE '^[[:space:]]*(deb-src[[:space:]]|Types:.*deb-src)' /etc/apt/sources.list \
       /etc/apt/sources.list.d/; then
    [ "$(id -u)" -eq 0 ] || {
      echo "pack-deps: apt has no deb-src source; add one (as root, or run this script as root once)" >&2; return 1; }
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$list"
    else
      grep -hE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list 2>/dev/null |
        sed 's/^\([[:space:]]*\)deb/\1deb-src/' >"${list%.sources}.list"
      list="${list%.sources}.list"
    fi
    echo "pack-deps: apt had no deb-src source: wrote $list (deb-src twins of the deb sources); apt-get update"
    apt-get update -qq
  fi
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  if ! (cd "$dir.tmp" && apt-get source --download-only "ffmpeg=$version" >log 2>&1); then
    if [ "$(id -u)" -eq 0 ]; then  # stale package lists: refresh once
      apt-get update -qq
      (cd "$dir.tmp" && apt-get source --download-only "ffmpeg=$version" >log 2>&1) ||
        { cat "$dir.tmp/log" >&2; return 1; }
    else cat "$dir.tmp/log" >&2; return 1; fi
  fi
  rm -f "$dir.tmp/log"; rm -rf "$dir"; mv "$dir.tmp" "$dir"
}
# The version of Debian's libavcodec-dev: installed, else the one apt would install.
ffmpeg_version() {
  local version
  version="$(dpkg-query -W -f='${Version}' libavcodec-dev 2>/dev/null || true)"
  [ -n "$version" ] || version="$(apt-cache policy libavcodec-dev 2>/dev/null | awk '/Candidate:/ { print $2 }')"
  [ "$version" != "(none)" ] || version=""
  echo "$version"
}
pack_ffmpeg() {
  need_debs "${ffmpeg_build_debs[@]}"
  local version="$1" work out lib so real t0 t1
  [ -n "$version" ] || { echo "pack-deps: apt knows no libavcodec-dev version" >&2; return 1; }
  fetch_ffmpeg_source "$version"
  work="$(mktemp -d "${TMPDIR:-/tmp}/vlatune-ffmpeg.XXXXXX")"
  # shellcheck disable=SC2064  # expand $work now
  trap "rm -rf '$work'" EXIT
  dpkg-source --no-check -x "$cache/ffmpeg-src/$version"/*.dsc "$work/src" >"$work/unpack.log" 2>&1 ||
    { cat "$work/unpack.log" >&2; return 1; }
  echo "pack-deps: building FFmpeg $version (minimal, shared) in $work"
  t0=$(date +%s)
  (cd "$work/src" && ./configure --prefix="$work/inst" "${ffmpeg_configure[@]}" >"$work/configure.log" 2>&1) ||
    { tail -30 "$work/src/ffbuild/config.log" >&2; return 1; }
  # RUNPATH $ORIGIN: each library finds its siblings (libavcodec -> libavutil, libdav1d, ...) wherever the folder
  # lies. Not through --extra-ldflags, which configure evals; here make expands the link line twice (library.mak's
  # $(eval)), turning `$$$$` into `$`, and the link command's shell gets `\$ORIGIN`.
  # shellcheck disable=SC2016
  echo 'LDSOFLAGS += -Wl,-rpath,\$$$$ORIGIN' >>"$work/src/ffbuild/config.mak"
  (cd "$work/src" && make -j"$(nproc)" >"$work/make.log" 2>&1 && make install >>"$work/make.log" 2>&1) ||
    { tail -30 "$work/make.log" >&2; return 1; }
  t1=$(date +%s)
  out="$work/inst"; lib="$out/lib"
  rm -rf "$out/share"
  # The codec libraries libavcodec needs (libdav1d.so.6, libSvtAv1Enc.so.1, libx264.so.164): by their soname.
  for so in $(readelf -d "$lib"/libavcodec.so |
              sed -n 's/.*NEEDED.*\[\(lib\(dav1d\|SvtAv1Enc\|x264\)\.so[^]]*\)\]/\1/p'); do
    real="$(ldconfig -p | awk -v n="$so" '$1 == n && /x86-64/ && !seen++ { print $NF }')"
    [ -n "$real" ] || real="/usr/lib/$multiarch/$so"
    cp -L "$real" "$lib/$so"
  done
  for so in libdav1d libSvtAv1Enc libx264; do
    ls "$lib/$so".so.* >/dev/null 2>&1 || { echo "pack-deps: libavcodec does not need $so" >&2; return 1; }
  done
  find "$lib" -maxdepth 1 -type f -name '*.so*' -exec strip --strip-unneeded {} +
  for so in "$lib"/libav*.so.* "$lib"/libsw*.so.*; do
    [ -L "$so" ] && continue
    [[ "$(readelf -d "$so")" == *"PATH)"*"[\$ORIGIN]"* ]] ||
      { echo "pack-deps: $so has no \$ORIGIN RUNPATH" >&2; return 1; }
  done
  relocate_pc "$lib/pkgconfig"
  echo "$version" >"$out/.complete"
  rm -rf "$dest/ffmpeg"; mv "$out" "$dest/ffmpeg"
  rm -rf "$work"; trap - EXIT
  echo "pack-deps: FFmpeg built in $((t1 - t0)) s (configure + make + install);" \
       "$(du -sh "$dest/ffmpeg" | cut -f1) in $dest/ffmpeg"
}

# --- .deps/sentencepiece: Debian's libsentencepiece (the processor and the trainer) -----------------------------
pack_sentencepiece() {
  local work out deb
  work="$(mktemp -d "${TMPDIR:-/tmp}/vlatune-spm.XXXXXX")"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" EXIT
  (cd "$work" && apt-get download libsentencepiece-dev libsentencepiece0 >log 2>&1) ||
    { cat "$work/log" >&2; return 1; }
  for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
  out="$work/out"; mkdir -p "$out/include" "$out/lib/pkgconfig"
  cp -a "$work"/root/usr/include/sentencepiece_*.h "$out/include/"
  cp -a "$work/root/usr/lib/$multiarch"/libsentencepiece*.so* "$out/lib/"
  cp -a "$work/root/usr/lib/$multiarch/pkgconfig/sentencepiece.pc" "$out/lib/pkgconfig/"
  if [ ! -e "$out/lib/libsentencepiece.so" ] || [ ! -e "$out/lib/libsentencepiece_train.so" ]; then
    echo "pack-deps: libsentencepiece.so link missing or dangling" >&2; return 1
  fi
  # The trainer needs libsentencepiece.so.0: let it find it beside itself (only where patchelf is installed).
  if command -v patchelf >/dev/null; then
    # shellcheck disable=SC2016
    patchelf --set-rpath '$ORIGIN' "$out"/lib/libsentencepiece_train.so.0.*
  fi
  relocate_pc "$out/lib/pkgconfig"
  touch "$out/.complete"
  rm -rf "$dest/sentencepiece"; mv "$out" "$dest/sentencepiece"
  rm -rf "$work"; trap - EXIT
  echo "pack-deps: $(du -sh "$dest/sentencepiece" | cut -f1) in $dest/sentencepiece"
}

mkdir -p "$dest"
[ -f "$dest/cudnn_frontend/include/cudnn_frontend.h" ] || pack_frontend
# The marker holds the package list it was made from: a longer list redoes this part.
if [ "$(cat "$dest/.complete" 2>/dev/null || true)" != "${pkgs[*]}" ]; then
  rm -rf "$dest/debs" "$dest/root"; mkdir -p "$dest/debs" "$dest/root"
  (cd "$dest/debs" && apt-get download "${pkgs[@]}" >/dev/null 2>&1)
  for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
  # Only protobuf-lite is linked: the full static library (7 MB) stays behind.
  rm -rf "$dest/debs" "$dest/root/usr/share/doc" "$dest/root/usr/share/man" \
         "$dest/root/usr/lib/$multiarch/libprotobuf.a"
  echo "${pkgs[*]}" >"$dest/.complete"
  echo "pack-deps: $(du -sh "$dest" | cut -f1) in $dest"
fi
# `if`, not `||`: set -e stays in force inside the functions. FFmpeg's marker holds the Debian version it was built
# from: a newer libavcodec-dev rebuilds it.
ffmpeg_want="$(ffmpeg_version)"
ffmpeg_have="$(cat "$dest/ffmpeg/.complete" 2>/dev/null || true)"
if [ -z "$ffmpeg_have" ] || { [ -n "$ffmpeg_want" ] && [ "$ffmpeg_have" != "$ffmpeg_want" ]; }; then
  pack_ffmpeg "$ffmpeg_want"
fi
if [ ! -f "$dest/sentencepiece/.complete" ]; then pack_sentencepiece; fi
