# Plan i21 of run-h200.sh (issue #21), sourced by its pipeline (cwd $W; uses W R NODE MODEL CUDA_ENV LB log
# build_dir lib_path). ONE device session of at most 24 minutes of device time: the machine's start (~1.5 min), the
# unpack (~1 min), then this pipeline, which ends when I21_MINUTES (default 21) have passed since it began: a step
# starts only when its usual time is left, and each runs under a timeout of at most the time left. Device calls (docs/gpu-h200.md, "Issue #21"):
#   1. bash .gpucarry/run-h200.sh start i21      (carry [".gpucarry"], timeout_s 600; returns after 575 s)
#   2. bash /tmp/k/run-h200.sh wait              (timeout_s 600; within 30 s of call 1)
#   3. BUDGET=240 bash /tmp/k/run-h200.sh wait   (returns when DONE), then give the machine back
# Minutes below are estimates from docs/gpu-h200.md's earlier runs (CUDA build with FA off 3:45 on 16 cores; 8 B
# model written in ~3 min; one compare.mjs round at 1/8/32/64 ≈ 2 min with server starts), pipeline time in [].
I21_T0=$(date +%s)
I21_DEADLINE=$((I21_T0 + ${I21_MINUTES:-21} * 60))
# step NAME NEED MAX: log the step and set LIM (its timeout: MAX seconds, or the time left if less), or skip it
# (false) when fewer than NEED seconds are left before the deadline.
step() {
  local left=$((I21_DEADLINE - $(date +%s)))
  if [ "$left" -lt "$2" ]; then log "SKIPPED $1: $left s left, needs ~$2 s"; return 1; fi
  LIM=$(( left < $3 ? left : $3 ))
  log "$1 ($left s left, timeout $LIM s)"
}
# stamp LOG: timestamp each line of stdin into $R/LOG, then show the file.
stamp() { while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/$1"; cat "$R/$1"; }
MODEL8B="$W/models/keel-llama3-8b-f16.gguf"
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
KEEL_SERVE="$NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --max_queued_requests 4096 --target_device GPU"
nvidia-smi dmon -s u -o T -d 1 > "$R/dmon.log" 2>&1 &
DMON=$!

# 1. [0–9 min] Both builds at once on the 16 cores (each alone: CUDA ~5–6 min with the flash-attention kernels,
#    sm_90 only, no FA_ALL_QUANTS; Vulkan ~5–7 min, most of it the shaders and ggml-vulkan.cpp), while one core
#    writes the models (8 B: ~3 min, 1.26 B: ~1.5 min) and torch measures the bandwidth (~0.5 min).
log "build: CUDA (flash attention kernels on) and Vulkan (bookworm SDK debs in a private prefix), in parallel"
( env "${CUDA_ENV[@]}" "$NODE" node_modules/node-llama-cpp/dist/cli/cli.js source build --gpu cuda > "$R/build-cuda.log" 2>&1; echo "build exit $?" >> "$R/build-cuda.log" ) &
CUDA_PID=$!
VKP="$W/vkp"
. "$W/bench/gpu/vulkan-build.sh"
VK_PID=""
if [ "$PLAN" != i21d ] && [ "$PLAN" != i21e ] && [ "$PLAN" != i21f ] && vulkan_unpack "$W/vk" > "$R/vulkan-unpack.log" 2>&1; then
  vulkan_build "$NODE" "$R/build-vulkan.log" &
  VK_PID=$!
fi
mkdir -p "$W/models"
# (plans i21e and i21f measure the 1.26 B model only: no 8 B model)
if [ "$PLAN" = i21e ] || [ "$PLAN" = i21f ]; then M8_PID=""; else
( /usr/bin/time -v "$NODE" bin/keel.mjs make-model --shape llama3-8b --f16 --out "$MODEL8B" > "$R/model8b.log" 2>&1 ) &
M8_PID=$!
fi
"$NODE" bench/gpu/write-model.mjs --out "$MODEL" --vocab 32000 --layers 24 --hidden 2048 --ff 5632 --heads 16 --kv-heads 8 --ctx 4096 --f16 || log "model write FAILED"
python3 bench/gpu/bandwidth.py > "$R/bandwidth.log" 2>&1
cat "$R/bandwidth.log"
wait "$CUDA_PID"
tail -n 2 "$R/build-cuda.log"
# The measurements need the CPU to themselves (Keel's step loop is host work): give the Vulkan build up to 2 more
# minutes, then let it finish at the lowest priority beside them (said in the log: read 2a–2c with that in mind).
for _ in $(seq 24); do [ -n "$VK_PID" ] && kill -0 "$VK_PID" 2>/dev/null && sleep 5; done
if [ -n "$VK_PID" ] && kill -0 "$VK_PID" 2>/dev/null; then
  log "the Vulkan build still runs: reniced to 19, measurements run beside it"
  # The build's process tree (ninja's later compiles inherit its priority).
  tree() { local p; for p in $(pgrep -P "$1"); do echo "$p"; tree "$p"; done; }
  renice -n 19 -p "$VK_PID" $(tree "$VK_PID") > /dev/null
fi
CUDA_DIR="$(build_dir cuda)"
LS="$(find "$CUDA_DIR" -name llama-server -type f -perm -u+x | head -1)"
BENCH="$(find "$CUDA_DIR" -name llama-bench -type f -perm -u+x | head -1)"
CUDA_ENV+=(LD_LIBRARY_PATH="$(lib_path "$CUDA_DIR")")   # the CUDA commands only (run-h200.sh says why)
log "CUDA build done: llama-server=$LS llama-bench=$BENCH"
# [+0.3 min] Keel's addon for the CUDA build (one native call samples a step).
env "${CUDA_ENV[@]}" "$NODE" scripts/build-native.mjs 2>&1 | tail -n 4

# compare LOG ARGS...: compare.mjs on CUDA (Keel vs the CUDA llama-server unless ARGS say otherwise).
# compare.mjs's own watchdog (--max-seconds) ends it 10 s before the step's timeout, stopping both servers.
compare() { local f="$1"; shift; env "${CUDA_ENV[@]}" timeout "$LIM" "$NODE" bench/compare.mjs --gpu --max-seconds $((LIM - 10)) "$@" 2>&1 | stamp "$f"; }

# trace NAME FA (plans i21d and i21e): one traced compare at 8 streams, 2 rounds; the trace files come back as NAME-*.log.
trace() {
  rm -rf "$R/$1"
  COMPARE_TRACE="$R/$1" compare "$1.log" --model "$MODEL" --tokens 256 --rounds 2 --concurrency 8 --flash-attention "$2" \
    --llama-server "$LS" --other-args "--cache-ram 0" throughput
  cp "$R/$1/requests.jsonl" "$R/$1-requests.log" 2>/dev/null
  grep -E '"event":"(engine_step|first_token|prefill_started|queued|finished)"' "$R/$1/keel.log" > "$R/$1-keel.log" 2>/dev/null
  rm -rf "$R/$1"
}
# The 8 B batch-1 steps plans i21b and i21d share: roofline_8b = llama-bench -fa 1, then Keel vs llama-server at one
# stream and 512 tokens; overlap_8b = Keel with the decode overlap on vs off (step labels as given).
roofline_8b() {
  wait "$M8_PID"; grep -E "Elapsed|Maximum resident" "$R/model8b.log"; ls -la "$MODEL8B"
  if step "c1. llama-bench 8B batch-1 decode, -fa 1" 60 100; then
    env "${CUDA_ENV[@]}" timeout "$LIM" "$BENCH" -m "$MODEL8B" -ngl 999 -fa 1 -p 0 -n 256 -r 2 -o md 2>&1 | grep -v "^ggml_\|^load" | tail -n 4 | tee "$R/bench-8b.log"
  fi
  step "c2. compare 8B at 1 stream, 512 tokens, flash attention on" 80 150 &&
    compare compare-8b-512.log --model "$MODEL8B" --tokens 512 --rounds 1 --concurrency 1 --min-reqs 3 --reqs 3 --ctx 1024 \
      --flash-attention on --llama-server "$LS" --other-args "--cache-ram 0" throughput
}
overlap_8b() {
  step "$1 Keel 8B at 1 stream: decode overlap on (keel, KEEL_DECODE_OVERLAP=on) vs off" 80 150 &&
    KEEL_DECODE_OVERLAP=on compare overlap-8b.log --model "$MODEL8B" --tokens 512 --rounds 1 --concurrency 1 --min-reqs 3 --reqs 3 --ctx 1024 \
      --flash-attention on --other-cmd "env ${CUDA_ENV[*]} KEEL_DECODE_OVERLAP=off $KEEL_SERVE --flash_attention true" \
      --other-name keel-no-overlap throughput
}

# Plan i21b (the second #21 session) measures other things once both builds are done: bench/gpu/plan-i21b.sh.
if [ "$PLAN" = i21b ]; then . "$W/bench/gpu/plan-i21b.sh"; kill "$DMON" 2>/dev/null; log "pipeline done"; date -u > "$R/DONE"; return 0; fi
if [ "$PLAN" = i21d ]; then . "$W/bench/gpu/plan-i21d.sh"; kill "$DMON" 2>/dev/null; log "pipeline done"; date -u > "$R/DONE"; return 0; fi
if [ "$PLAN" = i21e ] || [ "$PLAN" = i21f ]; then . "$W/bench/gpu/plan-$PLAN.sh"; kill "$DMON" 2>/dev/null; log "pipeline done"; date -u > "$R/DONE"; return 0; fi

# 2a. [~9–13 min] Keel vs llama-server on CUDA, 1/8/32/64 streams, one round, flash attention off, then on (both).
for fa in off on; do
  step "compare CUDA 1/8/32/64, flash attention $fa" 150 240 &&
    compare "compare-cuda-fa-$fa.log" --model "$MODEL" --tokens 256 --rounds 1 --flash-attention "$fa" --llama-server "$LS" \
      --other-args "--cache-ram 0" throughput
done

# 2b. [~13–17.5 min] The 8 B-shaped model at batch 1 (roofline = measured read bandwidth / 15.01 GB per token):
#     llama-bench with flash attention off and on (~1 min: one 16 GB load), Keel vs llama-server at 1 stream with
#     flash attention on (~1 min: 3 requests of 128 tokens each after a 16 GB load), and Keel with CUDA graphs off
#     vs on (~1 min).
wait "$M8_PID"; grep -E "Elapsed|Maximum resident" "$R/model8b.log"; ls -la "$MODEL8B"
if step "llama-bench 8B and 1.26B batch-1 decode, -fa 0,1" 90 150; then
  env "${CUDA_ENV[@]}" timeout "$LIM" "$BENCH" -m "$MODEL8B" -ngl 999 -fa 0,1 -p 0 -n 128 -r 2 -o md 2>&1 | grep -v "^ggml_\|^load" | tail -n 6 | tee "$R/bench-8b.log"
  env "${CUDA_ENV[@]}" timeout 60 "$BENCH" -m "$MODEL" -ngl 999 -fa 0,1 -p 0 -n 256 -r 3 -o md 2>&1 | grep -v "^ggml_\|^load" | tail -n 6 | tee "$R/bench-1b.log"
fi
step "compare 8B at 1 stream, flash attention on" 80 150 &&
  compare compare-8b-fa-on.log --model "$MODEL8B" --tokens 128 --rounds 1 --concurrency 1 --min-reqs 3 --reqs 3 --ctx 1024 \
    --flash-attention on --llama-server "$LS" --other-args "--cache-ram 0" throughput
step "Keel 8B at 1 stream: CUDA graphs on (keel) vs off (GGML_CUDA_DISABLE_GRAPHS=1), flash attention on" 80 150 &&
  compare cuda-graphs-8b.log --model "$MODEL8B" --tokens 128 --rounds 1 --concurrency 1 --min-reqs 3 --reqs 3 --ctx 1024 \
    --flash-attention on --other-cmd "env ${CUDA_ENV[*]} GGML_CUDA_DISABLE_GRAPHS=1 $KEEL_SERVE --flash_attention true" \
    --other-name keel-no-cuda-graphs throughput

# 2c. [~17.5–19.5 min] Speculative decoding (bench/speculative.mjs, the agent workload) on the 1.26 B model, Keel vs
#     llama-server's own speculative mode. The model has random weights: what a draft accepts there is synthetic
#     (prompt-lookup hits come from the prompt's own repeats, not from a model that copies), so read the tok/s on/off
#     as the mechanism's cost and ceiling, not as the gain on a real model (the real Qwen GGUF is over the carry's 64 MiB).
if [ -f bench/speculative.mjs ] && step "speculative decoding (synthetic acceptance: random-weight model)" 150 120; then
  env "${CUDA_ENV[@]}" timeout "$LIM" "$NODE" bench/speculative.mjs --gpu --model "$MODEL" --llama-server "$LS" --other-args "--cache-ram 0" 2>&1 | stamp speculative.log
fi

# 2d. [~19.5–22 min] Vulkan: Keel on the Vulkan build (its own addon, warm-up at load) vs llama-server of the SAME
#     Vulkan build, 1/8/32 streams, TTFT p99 shows any first-request compile stall (llama-server runs --no-warmup,
#     as compare.mjs starts it). Both on NVIDIA's Vulkan driver; the Vulkan build's libraries reach these only.
[ -n "$VK_PID" ] && wait "$VK_PID"
tail -n 2 "$R/build-vulkan.log" 2>/dev/null
VK_DIR="$(build_dir vulkan)"
LS_VK="$( [ -n "$VK_DIR" ] && find "$VK_DIR" -name llama-server -type f -perm -u+x | head -1)"
[ -f "$ICD" ] && export VK_DRIVER_FILES="$ICD"
if [ -n "$LS_VK" ]; then
  VK_RUN=("${VULKAN_ENV[@]}" LD_LIBRARY_PATH="$(lib_path "$VK_DIR")")
  log "Vulkan build done: $LS_VK; Keel's addon for it"
  env "${VK_RUN[@]}" VULKAN_SDK="$VKP/usr" LIBRARY_PATH="$VK_LIB" "$NODE" scripts/build-native.mjs 2>&1 | tail -n 4
  step "compare Vulkan 1/8/32: Keel-Vulkan vs llama-server-Vulkan" 100 300 &&
    env "${VK_RUN[@]}" timeout "$LIM" "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 1 --concurrency 1,8,32 \
      --llama-server "$LS_VK" --other-name llama-server-vulkan --other-args "--cache-ram 0" --max-seconds $((LIM - 10)) throughput 2>&1 | stamp compare-vulkan.log
else
  log "no Vulkan llama-server (build failed or unpack failed: see vulkan-unpack.log, build-vulkan.log)"
fi
kill "$DMON" 2>/dev/null
log "pipeline done ($(( $(date +%s) - I21_T0 )) s)"
date -u > "$R/DONE"
