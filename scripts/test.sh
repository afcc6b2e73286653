#!/usr/bin/env bash
# The README's test command (and CI's, via .ci/run): set up, build both tiers, run every CPU test, check the
# formatting, and run the torch-free tier again under AddressSanitizer + UBSan.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${VLATUNE_JOBS:-$(nproc)}"

bash scripts/setup.sh

echo "== build (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j "$jobs"

echo "== tests (ctest)"
ctest --test-dir build --output-on-failure

echo "== format (clang-format --dry-run -Werror)"
git ls-files '*.h' '*.cpp' '*.cu' | xargs clang-format --dry-run -Werror

echo "== torch-free tier under ASan+UBSan (build-asan/)"
cmake -S . -B build-asan -G Ninja -DVLATUNE_WITH_TORCH=OFF -DVLATUNE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
ninja -C build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure
