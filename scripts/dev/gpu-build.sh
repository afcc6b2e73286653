# Sourced by the GPU scripts (scripts/gpu-check.sh, scripts/dev/*-gpu.sh): one configure-and-build of build-gpu/
# against the GPU machine's torch wheel and what .deps carries (scripts/pack-deps.sh: Debian packages, and FFmpeg,
# SentencePiece and the policy server's headers where packed).
#   gpu_build LOG_DIR [ninja target...]   (all targets when none; cmake.log and build.log go to LOG_DIR)
#   gpu_build_tested LOG_DIR OUT          (vlatune, and the GPU tests named by TESTS built and run: below)
# Expects $root (the repository root). ARCHS: CUDA architectures (default 9.0, the H200; "8.0;8.6;8.9;9.0+PTX" is
# the release set). VLATUNE_COMMIT names the commit (else git's HEAD: a device copy's git metadata can lag the tree).
# Exports LD_LIBRARY_PATH for the carried shared libraries. Returns 4 without .deps, 1 on a failed step (log tail
# printed).
gpu_build() {
  local log_dir="$1"
  shift
  local deps="$root/.deps"
  local prefix="$deps/root/usr"
  [ -d "$prefix" ] || { echo "gpu_build: .deps missing: run scripts/pack-deps.sh here and carry .deps" >&2; return 4; }
  [ -d "$deps/serve/include" ] && prefix="$prefix;$deps/serve"
  local extra=() lib
  for lib in ffmpeg sentencepiece; do
    [ -d "$deps/$lib/lib" ] || continue
    extra+=("-DVLATUNE_$(echo "$lib" | tr a-z A-Z)_ROOT=$deps/$lib")
    export LD_LIBRARY_PATH="$deps/$lib/lib:${LD_LIBRARY_PATH:-}"
  done
  local commit="${VLATUNE_COMMIT:-$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
  mkdir -p "$log_dir"
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLATUNE_PYTHON="$(command -v python3)" \
    -DVLATUNE_CUDA=ON -DVLATUNE_CUDA_ARCHS="${ARCHS:-9.0}" -DVLATUNE_GIT_COMMIT="$commit" \
    -DCMAKE_PREFIX_PATH="$prefix" "${extra[@]}" >"$log_dir/cmake.log" 2>&1 ||
    { tail -40 "$log_dir/cmake.log"; return 1; }
  ninja -C "$root/build-gpu" -j "$(nproc)" "$@" >"$log_dir/build.log" 2>&1 || { tail -60 "$log_dir/build.log"; return 1; }
}

# gpu_build_tested LOG_DIR OUT: gpu_build of vlatune, plus vlatune_tests_torch when TESTS (a Catch2 spec of GPU test
# cases) is set, which then runs with its output in OUT/tests.log and its exit status and last lines echoed.
# Returns 1 when the build fails (a failing test does not stop the caller).
gpu_build_tested() {
  local log_dir="$1" out="$2" targets=(vlatune)
  [ -n "${TESTS:-}" ] && targets+=(vlatune_tests_torch)
  gpu_build "$log_dir" "${targets[@]}" || return 1
  [ -n "${TESTS:-}" ] || return 0
  "$root/build-gpu/tests/vlatune_tests_torch" "$TESTS" >"$out/tests.log" 2>&1
  echo "tests exit $?: $(tail -2 "$out/tests.log" | tr '\n' ' ')"
}
