# A Vulkan build of llama.cpp on a machine without the Vulkan SDK, for BOTH Keel's addon and llama-server (one
# node-llama-cpp `source build --gpu vulkan` with llama.cpp's tools and server on). Sourced by run-h200.sh (plan
# i21) and usable on a CPU machine to check the recipe (docs/gpu-h200.md, "Vulkan build"):
#
#   VKP=/tmp/vkp; . bench/gpu/vulkan-build.sh
#   vulkan_unpack DEB_DIR          # dpkg -x every .deb into $VKP (never into /) and writes the glslc wrapper
#   vulkan_build NODE LOG          # node-llama-cpp source build --gpu vulkan with "${VULKAN_ENV[@]}" (cwd: Keel root)
#   env "${VULKAN_ENV[@]}" ...     # the same options find the build again (they name its folder): serving, addon
#
# The .deb files (bench/gpu/make-carry.sh downloads them into vk/): Debian bookworm's glslc + libshaderc1 (shader
# compiler, 2023.2), libvulkan1 (the libvulkan.so.1 to link against) and spirv-headers (CMake config for ggml-vulkan's
# find_package(SPIRV-Headers CONFIG)); Debian trixie's libvulkan-dev (headers 1.4.309): bookworm's 1.3.239 headers
# lack vk::LayerSettingEXT, used unguarded in ggml_vk_instance_init (every other newer feature is behind
# `#if defined(VK_…)`). Bookworm's glslc has none of the shader extensions ggml-vulkan tests for (cooperative matrix
# KHR/NV2, integer dot, bfloat16, fp4/fp8): those paths are compiled out, for Keel and llama-server alike (the
# prebuilt binary, built with a newer SDK, has them). Trixie's glslc would have them but needs glibc ≥ 2.38. At run time the Vulkan loader comes
# from the machine or from gl/libvulkan1 (run-h200.sh), the driver from NVIDIA's ICD (or Mesa's lavapipe on a CPU).
VKP="${VKP:-/tmp/vkp}"
VK_LIB="$VKP/usr/lib/x86_64-linux-gnu"
# The build options, as node-llama-cpp reads them from the environment. They name the build folder too, so every
# process that should load this build (Keel, scripts/build-native.mjs) runs with exactly these variables.
VULKAN_ENV=(
  NODE_LLAMA_CPP_CMAKE_OPTION_Vulkan_INCLUDE_DIR="$VKP/usr/include"
  NODE_LLAMA_CPP_CMAKE_OPTION_Vulkan_LIBRARY="$VK_LIB/libvulkan.so"
  NODE_LLAMA_CPP_CMAKE_OPTION_Vulkan_GLSLC_EXECUTABLE="$VKP/glslc"
  NODE_LLAMA_CPP_CMAKE_OPTION_CMAKE_PREFIX_PATH="$VKP/usr"
  NODE_LLAMA_CPP_CMAKE_OPTION_LLAMA_BUILD_TOOLS="${KEEL_VK_TOOLS:-ON}"
  NODE_LLAMA_CPP_CMAKE_OPTION_LLAMA_BUILD_SERVER="${KEEL_VK_TOOLS:-ON}"
  NODE_LLAMA_CPP_CMAKE_OPTION_LLAMA_USE_PREBUILT_UI=OFF
)

# vulkan_unpack DEB_DIR: the SDK pieces into $VKP; glslc gets a wrapper that finds its libshaderc.so.1 there (a
# global LD_LIBRARY_PATH would reach every other process of the build and the runs).
vulkan_unpack() {
  local f
  mkdir -p "$VKP"
  for f in "$1"/*.deb; do dpkg -x "$f" "$VKP" || return 1; done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$VK_LIB" "$VKP/usr/bin/glslc" > "$VKP/glslc"
  chmod +x "$VKP/glslc"
  "$VKP/glslc" --version | head -1
}

# vulkan_build NODE LOG: the build (cwd: the Keel root whose node_modules/node-llama-cpp/llama/llama.cpp holds the
# source; `npm` must be the stand-in of run-h200.sh or a real npm). Exit status of the build.
vulkan_build() {
  env "${VULKAN_ENV[@]}" "$1" node_modules/node-llama-cpp/dist/cli/cli.js source build --gpu vulkan > "$2" 2>&1
  local rc=$?
  echo "build exit $rc" >> "$2"
  return $rc
}

# vulkan_bin_dir: the build's binary folder (llama-server, llama-bench and the shared libraries), empty when none.
vulkan_bin_dir() {
  find node_modules/node-llama-cpp/llama/localBuilds -maxdepth 1 -type d -name '*vulkan*' 2>/dev/null | head -1
}
