#!/usr/bin/env bash
# Makes the carry folder for bench/gpu/run-h200.sh (the GPU machine has no package registry and a 64 MiB limit on
# what travels). Reuses finished pieces; rebuild one by deleting it. Run `node scripts/prepare.mjs` first (dist/).
#
#   bash bench/gpu/make-carry.sh [CARRY_DIR]     # default: .gpucarry in the repository root (must be git-ignored,
#                                                # e.g. listed in .git/info/exclude)
# Then a device call: carry [".gpucarry"], command "bash .gpucarry/run-h200.sh start".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
C="${1:-$ROOT/.gpucarry}"
TMP="${TMPDIR:-/tmp}/keel-gpucarry"
LLAMA="$ROOT/node_modules/node-llama-cpp/llama"
mkdir -p "$C" "$TMP"

# 1. The node binary (≈ 24 MB with xz -9).
[ -f "$C/node.xz" ] || xz -T0 -9 -c "$(command -v node)" > "$C/node.xz"

# 2. Production node_modules without the prebuilt GPU packages and the 34 MB git bundle, plus the llama.cpp source
#    checked out from that bundle (patches applied as node-llama-cpp does after a download; docs, examples, tests and
#    models removed), plus the Node headers as hdr/include/node (cmake-js's nodedir).
if [ ! -f "$C/nm.tar.xz" ]; then
  rm -rf "$TMP/llama.cpp" "$TMP/hdr"
  git -c advice.detachedHead=false clone -q "$LLAMA/gitRelease.bundle" "$TMP/llama.cpp"
  for p in "$LLAMA"/patches/*.diff; do git -C "$TMP/llama.cpp" apply --ignore-whitespace "$p"; done
  (cd "$TMP/llama.cpp" && rm -rf .git docs examples tests models media gguf-py pocs benches conversion app skills requirements ./*.py)
  # npm prints real paths: a node_modules that is a link (a git worktree sharing another checkout's) is mapped back.
  NM_REAL="$(cd "$ROOT/node_modules" && pwd -P)"
  (cd "$ROOT" && npm ls --omit=dev --parseable --all 2>/dev/null | sed "s#^$NM_REAL#node_modules#; s#^$ROOT/##" | grep -E '^node_modules/(@[^/]+/)?[^/@][^/]*$' \
    | grep -v -E '^node_modules/(@node-llama-cpp/|@typescript/|typescript$)' | sort -u) > "$TMP/top.txt"
  tar -C "$ROOT" -cf "$TMP/nm.tar" --exclude=node_modules/node-llama-cpp/llama/gitRelease.bundle \
    --exclude=node_modules/node-llama-cpp/llama/localBuilds -T "$TMP/top.txt"
  tar -C "$TMP" -rf "$TMP/nm.tar" --transform 's#^llama.cpp#node_modules/node-llama-cpp/llama/llama.cpp#' llama.cpp
  mkdir -p "$TMP/hdr/include" && cp -r /usr/include/node "$TMP/hdr/include/"
  tar -C "$TMP" -rf "$TMP/nm.tar" hdr
  xz -T0 -9 -c "$TMP/nm.tar" > "$C/nm.tar.xz"
fi

# 3. The prebuilt Vulkan binary of node-llama-cpp (Keel's Vulkan path, the one an Intel Arc user takes).
[ -f "$C/vulkan.tar.xz" ] || tar -C "$ROOT/node_modules/@node-llama-cpp" -cf - linux-x64-vulkan | xz -T0 -6 > "$C/vulkan.tar.xz"

# 4. The Vulkan loader and GL libraries as .deb files (unpacked on the device only if it has no loader).
if [ ! -d "$C/gl" ]; then
  mkdir -p "$C/gl" "$TMP/apt/partial"
  o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$TMP/apt"
  apt-get $o update > /dev/null
  (cd "$C/gl" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 > /dev/null)
fi

# 4b. The Vulkan SDK pieces a Vulkan build of llama.cpp needs (plan i21; bench/gpu/vulkan-build.sh unpacks them into a
#     private prefix on the device), ≈ 4 MB: Debian bookworm's glslc + libshaderc1 (binaries: bookworm's glibc 2.36
#     is old enough for the device), libvulkan1 (libvulkan.so's target) and spirv-headers; the Vulkan headers from
#     Debian trixie's libvulkan-dev (1.4.309, architecture-independent headers): bookworm's 1.3.239 lack
#     vk::LayerSettingEXT, which ggml-vulkan.cpp uses unguarded (ggml_vk_instance_init).
if [ ! -d "$C/vk" ]; then
  mkdir -p "$C/vk" "$TMP/apt/partial" "$TMP/apt-trixie/partial"
  o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$TMP/apt"
  apt-get $o update > /dev/null
  (cd "$C/vk" && apt-get $o download glslc libshaderc1 libvulkan1 spirv-headers > /dev/null)
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$TMP/trixie.list"
  t="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$TMP/apt-trixie -oDir::Etc::SourceList=$TMP/trixie.list -oDir::Etc::SourceParts=/dev/null"
  apt-get $t update > /dev/null
  (cd "$C/vk" && apt-get $t download libvulkan-dev > /dev/null)
fi

# 5. This checkout's Keel (always refreshed; with the native addon's sources and build script) and the script itself.
tar -C "$ROOT" -cJf "$C/keel.tar.xz" bin dist bench package.json scripts/build-native.mjs src/native
cp "$ROOT/bench/gpu/run-h200.sh" "$C/run-h200.sh"
du -sh "$C"/*
