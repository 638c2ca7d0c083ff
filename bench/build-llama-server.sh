#!/usr/bin/env bash
# Builds llama-server from the very llama.cpp source node-llama-cpp ships (its gitRelease.bundle), without the network,
# so bench/compare.mjs can run Keel and llama-server on the same ggml kernels. Idempotent: a finished build is reused.
#
#   bash bench/build-llama-server.sh            # prints the path of the llama-server binary on its last line
#   KEEL_CACHE_DIR=/somewhere bash bench/build-llama-server.sh
#   JOBS=16 NICE=0 bash bench/build-llama-server.sh   # on a bigger machine
#
# Output: ${KEEL_CACHE_DIR:-~/.cache/keel}/llama-server/<release>/ with src/ (the checkout), build/ and a stamp file
# naming the commit and the cmake options; a build whose stamp differs is redone.
#
# CPU switches: GGML_NATIVE=OFF with the x86 extensions named one by one. Default: those of the ggml CPU variant
# node-llama-cpp's prebuilt binary loads on the dev VM (libggml-cpu-sapphirerapids.so: SSE4.2, AVX, F16C, FMA, AVX2,
# BMI2, AVX-512 F/CD/VL/DQ/BW with VBMI, VNNI and BF16) WITHOUT its AMX-TILE/AMX-INT8: a llama-server built with them
# dies with SIGILL at `tilezero` in ggml's tinygemm_kernel_amx as soon as it loads a Q4_1 model (SmolLM2), although
# Keel's prebuilt variant repacks Q4_0/Q4_1/Q8_0 weights into ggml's AMX buffer type and runs them (and a tile dot
# product in C works after arch_prctl(ARCH_REQ_XCOMP_PERM)). So on quantized models Keel has AMX and llama-server
# AVX-512 VNNI; on F16/F32 models (keel-tiny, the GPU writer's models) AMX plays no part. On another machine pick
# its set, e.g. CPU_FEATURES="AVX AVX2 FMA F16C"; CPU_FEATURES="... AMX_TILE AMX_INT8" to try AMX. Unset, the default set is
# filtered by /proc/cpuinfo (a host without AVX-512 gets SSE4.2/AVX/F16C/FMA/AVX2/BMI2).
# OpenMP is off, as in node-llama-cpp's prebuilt binaries (CI mode sets GGML_OPENMP=OFF), so both servers use ggml's
# own thread pool.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA_DIR="$ROOT/node_modules/node-llama-cpp/llama"
BUNDLE="$LLAMA_DIR/gitRelease.bundle"
JOBS="${JOBS:-2}"
NICE="${NICE:-19}"
# The default set, less what this CPU lacks (/proc/cpuinfo): an AVX-512 build dies with SIGILL on a host without it.
ALL_FEATURES="SSE42:sse4_2 AVX:avx F16C:f16c FMA:fma AVX2:avx2 BMI2:bmi2 AVX512:avx512f AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16"
if [ -z "${CPU_FEATURES:-}" ]; then
  CPU_FLAGS=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  for fc in $ALL_FEATURES; do
    case "$CPU_FLAGS" in *" ${fc#*:} "*) CPU_FEATURES="${CPU_FEATURES:-} ${fc%%:*}" ;; esac
  done
fi

[ -f "$BUNDLE" ] || { echo "no $BUNDLE: run npm ci first" >&2; exit 1; }
# 1. The release tag comes from node-llama-cpp's own record; the commit from the bundle's HEAD.
RELEASE="$(node -e 'process.stdout.write(require(process.argv[1]).release)' "$LLAMA_DIR/binariesGithubRelease.json")"
COMMIT="$(git bundle list-heads "$BUNDLE" | awk '$2=="HEAD"{print $1}')"
OUT="${KEEL_CACHE_DIR:-$HOME/.cache/keel}/llama-server/$RELEASE"
SRC="$OUT/src"
BUILD="$OUT/build"
BIN="$BUILD/bin/llama-server"

CMAKE_OPTS=(
  -G Ninja -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF
)
# Every known switch explicitly ON or OFF: CMake keeps a cached ON when a later configure merely omits it.
for fc in $ALL_FEATURES; do
  f="${fc%%:*}"
  case " $CPU_FEATURES " in *" $f "*) CMAKE_OPTS+=("-DGGML_$f=ON") ;; *) CMAKE_OPTS+=("-DGGML_$f=OFF") ;; esac
done
for f in $CPU_FEATURES; do case " $ALL_FEATURES " in *" $f:"*) ;; *) CMAKE_OPTS+=("-DGGML_$f=ON") ;; esac; done
CMAKE_OPTS+=(${EXTRA_CMAKE_OPTS:-})
STAMP="commit=$COMMIT opts=${CMAKE_OPTS[*]}"

# 2. Reuse a finished build with the same commit and options.
if [ -x "$BIN" ] && [ -f "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$STAMP" ]; then
  echo "$BIN"
  exit 0
fi

# 3. Check the source out of the bundle (what node-llama-cpp's `source download` does, minus the network).
mkdir -p "$OUT"
if [ ! -d "$SRC/.git" ] || [ "$(git -C "$SRC" rev-parse HEAD)" != "$COMMIT" ]; then
  rm -rf "$SRC" "$BUILD"
  git -c advice.detachedHead=false clone -q "$BUNDLE" "$SRC"
  git -C "$SRC" -c advice.detachedHead=false checkout -q "$COMMIT"
fi

# 4. node-llama-cpp applies its patches after a download unless the source already has them; do the same so the
#    library matches the one Keel loads (the check mirrors its canSkip test).
for p in "$LLAMA_DIR"/patches/*.diff; do
  [ -f "$p" ] || continue
  if git -C "$SRC" apply --ignore-whitespace --check "$p" 2>/dev/null; then
    git -C "$SRC" apply --ignore-whitespace "$p"
    echo "applied $(basename "$p")" >&2
  elif git -C "$SRC" apply --ignore-whitespace --reverse --check "$p" 2>/dev/null; then
    echo "already applied $(basename "$p")" >&2
  else
    echo "patch $(basename "$p") does not apply; building without it" >&2
  fi
done

# 5. Configure and build only the llama-server target, at low priority (other jobs share the machine).
rm -f "$OUT/stamp"
nice -n "$NICE" cmake -S "$SRC" -B "$BUILD" "${CMAKE_OPTS[@]}" >&2
nice -n "$NICE" cmake --build "$BUILD" --target llama-server -j "$JOBS" >&2
[ -x "$BIN" ] || { echo "build finished without $BIN" >&2; exit 1; }
echo "$STAMP" > "$OUT/stamp"
echo "$BIN"
