# Plan i21b of run-h200.sh (issue #21, second session), sourced by plan-i21.sh once both builds are done (uses its
# step, stamp, compare, roofline_8b, overlap_8b, MODEL, LS, CUDA_ENV, KEEL_SERVE, VK_PID). Device calls as plan i21's,
# with `start i21b`; I21_MINUTES=23 leaves a minute of the 30 for the start. In order of what the issue needs most:
#   a. the issue's own setting (flash attention off) with 4 rounds, so TTFT p50 has 32+ requests a cell;
#   b. flash attention on, 3 rounds;
#   c. the 8 B batch-1 roofline: llama-bench -fa 1, Keel vs llama-server at 512 tokens, Keel's decode overlap on vs off;
#   d. the overlap A/B on the 1.26 B model at 1/8/64 streams;
#   e. Vulkan (same build for both servers), 2 rounds, Keel with the decode overlap on (its host work per token is
#      what kept one stream at 0.90–0.96 of llama-server's).

step "a. compare CUDA 1/8/32/64, flash attention off, 4 rounds" 200 330 &&
  compare compare-cuda-fa-off-4r.log --model "$MODEL" --tokens 256 --rounds 4 --flash-attention off --llama-server "$LS" \
    --other-args "--cache-ram 0" throughput
step "b. compare CUDA 1/8/32/64, flash attention on, 3 rounds" 170 260 &&
  compare compare-cuda-fa-on-3r.log --model "$MODEL" --tokens 256 --rounds 3 --flash-attention on --llama-server "$LS" \
    --other-args "--cache-ram 0" throughput

roofline_8b
overlap_8b "c3."
step "d. Keel 1.26B 1/8/64: decode overlap on (keel, KEEL_DECODE_OVERLAP=on) vs off, flash attention on, 2 rounds" 100 160 &&
  KEEL_DECODE_OVERLAP=on compare overlap-1b.log --model "$MODEL" --tokens 256 --rounds 2 --concurrency 1,8,64 --flash-attention on \
    --other-cmd "env ${CUDA_ENV[*]} KEEL_DECODE_OVERLAP=off $KEEL_SERVE --flash_attention true" \
    --other-name keel-no-overlap throughput

# e. Vulkan: Keel on the Vulkan build (its own addon, warm-up at load) vs llama-server of the same build.
[ -n "$VK_PID" ] && wait "$VK_PID"
tail -n 2 "$R/build-vulkan.log" 2>/dev/null
VK_DIR="$(build_dir vulkan)"
LS_VK="$( [ -n "$VK_DIR" ] && find "$VK_DIR" -name llama-server -type f -perm -u+x | head -1)"
[ -f "$ICD" ] && export VK_DRIVER_FILES="$ICD"
if [ -n "$LS_VK" ] && step "e. compare Vulkan 1/8/32, 2 rounds" 150 300; then
  VK_RUN=("${VULKAN_ENV[@]}" LD_LIBRARY_PATH="$(lib_path "$VK_DIR")")
  env "${VK_RUN[@]}" VULKAN_SDK="$VKP/usr" LIBRARY_PATH="$VK_LIB" "$NODE" scripts/build-native.mjs 2>&1 | tail -n 4
  env "${VK_RUN[@]}" KEEL_DECODE_OVERLAP=on timeout "$LIM" "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 2 --concurrency 1,8,32 \
    --llama-server "$LS_VK" --other-name llama-server-vulkan --other-args "--cache-ram 0" --max-seconds $((LIM - 10)) throughput 2>&1 | stamp compare-vulkan-2r.log
fi
