#!/usr/bin/env bash
# Keel on the lent H200: build, model, bandwidth, Keel vs llama-server (CUDA), Keel on Vulkan — in the background of
# one warm machine, so the work can outlast one 10-minute device command (docs/gpu-h200.md has the results).
#
#   bash bench/gpu/run-h200.sh start   # device call 1: unpack the carry, start the pipeline (setsid), wait, copy logs
#   bash /tmp/k/run-h200.sh wait       # device call 2..n (within 30 s of the last, while the machine is warm)
#
# The carry folder (bench/gpu/make-carry.sh makes it; it must be named in `carry`): node.xz (the local node binary),
# nm.tar.xz (production node_modules without @node-llama-cpp/* prebuilt GPU packages and without gitRelease.bundle,
# plus node-llama-cpp/llama/llama.cpp checked out from that bundle with llama/patches applied, plus Node headers
# under hdr/include/node), vulkan.tar.xz (@node-llama-cpp/linux-x64-vulkan, the prebuilt Vulkan binary), keel.tar.xz
# (bin/ dist/ bench/ package.json of this checkout), gl/*.deb (the Vulkan loader, for machines without one) and
# vk/*.deb (the Vulkan SDK pieces for a Vulkan build of llama.cpp: bench/gpu/vulkan-build.sh).
#
# Pipeline (each step logs to $R/run.log with a timestamp; a failed step is logged and the next steps still run):
#   1. node-llama-cpp `source build --gpu cuda` with llama.cpp's tools and server on (one build: Keel's addon and a
#      llama-server/llama-bench linked to the same libllama/libggml-cuda), flash-attention kernels compiled out;
#      meanwhile the model is written (bench/gpu/write-model.mjs: 1.26 B parameters, F16, vocab 32,000, 2.53 GB) and
#      the memory bandwidth is measured (torch: read-only sum and device-to-device copy of 4 GiB).
#      Then Keel's native addon is built against that build (scripts/build-native.mjs).
#   2. llama-bench batch-1 decode (no server): the engine's own ceiling for the roofline.
#   3. compare.mjs --gpu throughput: Keel vs llama-server at 1/8/32/64 streams, 256 tokens, 3 interleaved rounds;
#      nvidia-smi dmon samples GPU utilisation meanwhile.
#   4. Keel on Vulkan (prebuilt binary) vs Keel on CUDA at 1/8/32 streams.
#   5. compare.mjs --gpu mixed storm (Keel vs llama-server).
set -uo pipefail
MODE="${1:-start}"
# PLAN (second argument of start): main = the measurements below; probe = after a main run: why Vulkan did not load,
# a V8 profile of Keel at 32 streams, engine threads 2 vs 15, and Keel vs llama-server with 2 threads each;
# i21 = issue #21 in one session (bench/gpu/plan-i21.sh: CUDA with flash attention and a Vulkan build of both servers);
# i21b = its second session (the same builds, then bench/gpu/plan-i21b.sh: more rounds, the decode overlap A/B);
# i21c = the same A/B within 10 minutes of device time (bench/gpu/plan-i21c.sh: CUDA without flash attention only).
# i21d = the fourth #21 session: CUDA only (no Vulkan build), the 8 B roofline again, the 8-stream TTFT timeline
#        (bench/gpu/plan-i21d.sh).
# i21e = a short follow-up (about 10 minutes of device time): CUDA only, no 8 B model; sampled requests (temperature
#        0.8) at 8/64 streams and more rounds of the 1/8-stream TTFT (bench/gpu/plan-i21e.sh).
# i21f = as i21e, measuring the shared KV buffer (--kv_unified) against llama-server and against Keel without it
#        (bench/gpu/plan-i21f.sh).
export PLAN="${PLAN:-${2:-main}}"
W="${KEEL_GPU_WORK:-/tmp/k}"   # work folder on the device (survives between calls while the machine is warm)
R=$W/results             # logs, copied to $OUT by every call
BUDGET="${BUDGET:-575}"  # seconds a call waits before it returns (its limit is 600)
T0=$(date +%s)

copy_out() {
  [ -n "${OUT:-}" ] || return 0
  # The device tool brings back at most 8 files: run.log, DONE and one archive of every other log (build logs as
  # their last 400 lines).
  cp "$R/run.log" "$OUT/run.log"
  [ -f "$R/DONE" ] && cp "$R/DONE" "$OUT/DONE"
  mkdir -p "$R/tails"
  for f in "$R"/*build*.log; do [ -f "$f" ] && tail -n 400 "$f" > "$R/tails/$(basename "$f")"; done
  (cd "$R" && tar -czf "$OUT/results.tar.gz" --exclude='*build*.log' --exclude=run.log ./*.log tails 2>/dev/null)
  return 0
}
wait_and_copy() {
  while [ ! -f "$R/DONE" ] && [ $(( $(date +%s) - T0 )) -lt "$BUDGET" ]; do sleep 5; done
  echo "== $( [ -f "$R/DONE" ] && echo finished || echo still running ) after $(( $(date +%s) - T0 )) s of this call"
  tail -n 60 "$R/run.log"
  copy_out
}

if [ "$MODE" = wait ]; then
  wait_and_copy
  exit 0
fi

if [ "$MODE" = start ]; then
  C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"   # the carry folder (this script is copied into it)
  mkdir -p "$W/nodebin" "$W/shim" "$R"
  cp "$C/run-h200.sh" "$W/run-h200.sh"
  {
    echo "== $(date -u +%T) unpack from $C"
    xz -dc "$C/node.xz" > "$W/nodebin/node" && chmod +x "$W/nodebin/node"
    tar -C "$W" -xJf "$C/nm.tar.xz"
    tar -C "$W" -xJf "$C/keel.tar.xz"
    mkdir -p "$W/node_modules/@node-llama-cpp" && tar -C "$W/node_modules/@node-llama-cpp" -xJf "$C/vulkan.tar.xz"
    mkdir -p "$W/node_modules/node-llama-cpp/llama/llama.cpp/.git"   # node-llama-cpp checks that the source is a checkout
    [ -d "$C/vk" ] && rm -rf "$W/vk" && cp -r "$C/vk" "$W/vk"          # Vulkan SDK debs (plan i21: vulkan-build.sh)
    # Vulkan loader: only if the machine has none (README of the device tool).
    if command -v nvidia-smi > /dev/null && ! ldconfig -p | grep -q libvulkan.so.1; then for f in "$C"/gl/*.deb; do dpkg -x "$f" /; done; ldconfig; echo "installed the Vulkan loader from gl/"; fi
    echo "node $("$W/nodebin/node" -v); $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader)"
    echo "nvcc: $(nvcc --version | tail -1); cmake $(cmake --version | head -1); cores $(nproc)"
    echo "vulkan: $(ldconfig -p | grep -c libvulkan) loader libs; icd files: $(ls /usr/local/nvidia/share/vulkan/icd.d/ /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d 2>/dev/null | tr '\n' ' ')"
    echo "glslc: $(command -v glslc || echo none); vulkan headers: $(ls /usr/include/vulkan/vulkan.h 2>/dev/null || echo none)"
  } > "$R/run.log" 2>&1
  # npm stand-in: node-llama-cpp's build runs `npm run -s cmake-js-llama -- ARGS` (= cd llama && cmake-js ARGS).
  cat > "$W/shim/npm" <<EOF
#!/bin/sh
[ "\$1 \$2 \$3 \$4" = "run -s cmake-js-llama --" ] || { echo "npm stand-in: unexpected \$*" >&2; exit 1; }
shift 4
cd "$W/node_modules/node-llama-cpp/llama" && exec "$W/nodebin/node" "$W/node_modules/cmake-js/bin/cmake-js" "\$@"
EOF
  chmod +x "$W/shim/npm"
  setsid nohup bash "$W/run-h200.sh" pipeline >> "$R/run.log" 2>&1 < /dev/null &
  wait_and_copy
  exit 0
fi

[ "$MODE" = pipeline ] || { echo "unknown mode $MODE (start | wait)"; exit 2; }
# ---------------- the pipeline (runs detached) ----------------
# KEEL_GPU_DRY=1: stop here (a local check of the unpack and the stand-ins, without a build).
if [ -n "${KEEL_GPU_DRY:-}" ]; then echo "dry run: pipeline not started"; date -u > "$R/DONE"; exit 0; fi
export PATH="$W/nodebin:$W/shim:$PATH"
export npm_config_nodedir="$W/hdr"   # cmake-js reads the Node headers here instead of downloading them
log() { echo "== $(date -u +%T) $*"; }
cd "$W"
NODE="$W/nodebin/node"
MODEL="$W/models/keel-tiny-gpu-1b.gguf"
# These options name the build folder too: the serving processes need the same environment to find the build.
CUDA_ENV=(
  NODE_LLAMA_CPP_CMAKE_OPTION_CMAKE_CUDA_ARCHITECTURES=90
  NODE_LLAMA_CPP_CMAKE_OPTION_LLAMA_BUILD_TOOLS=ON
  NODE_LLAMA_CPP_CMAKE_OPTION_LLAMA_BUILD_SERVER=ON
  NODE_LLAMA_CPP_CMAKE_OPTION_LLAMA_USE_PREBUILT_UI=OFF
  NODE_LLAMA_CPP_CMAKE_OPTION_GGML_CUDA_FA="$( case "$PLAN" in i21|i21b|i21d|i21e|i21f) echo ON ;; *) echo OFF ;; esac )"   # i21: flash attention kernels in
)
LB="$W/node_modules/node-llama-cpp/llama/localBuilds"
# build_dir GPU: the local build folder of node-llama-cpp for that GPU (cuda, vulkan); lib_path DIR: its library
# folders as an LD_LIBRARY_PATH value.
build_dir() { find "$LB" -maxdepth 1 -type d -name "*-$1*" 2>/dev/null | head -1; }
lib_path() { find "$1" -name '*.so*' -printf '%h\n' | sort -u | tr '\n' ':'; }
# Plan i21 (issue #21) lives in its own file: both builds in parallel, flash attention, the roofline, Vulkan.
if [ "$PLAN" = i21 ] || [ "$PLAN" = i21b ] || [ "$PLAN" = i21d ] || [ "$PLAN" = i21e ] || [ "$PLAN" = i21f ]; then . "$W/bench/gpu/plan-i21.sh"; exit 0; fi
if [ "$PLAN" = i21c ]; then . "$W/bench/gpu/plan-i21c.sh"; exit 0; fi

if [ "$PLAN" = vkkvu ]; then
  # The shared KV buffer (--kv_unified) on the prebuilt Vulkan binary, no build of llama.cpp (about 4 minutes): Keel's
  # addon for that binary, a 12-layer 0.65 B F16 model (written in half the time of the 1.26 B one), then Keel with it
  # vs without it at 8/32 streams, 128 tokens, one round.
  for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do [ -f "$f" ] && export VK_DRIVER_FILES="$f"; done
  mkdir -p "$W/models"
  MODEL="$W/models/keel-tiny-gpu-0.65b.gguf"
  ( "$NODE" bench/gpu/write-model.mjs --out "$MODEL" --vocab 32000 --layers 12 --hidden 2048 --ff 5632 --heads 16 --kv-heads 8 --ctx 4096 --f16 || log "model write FAILED" ) &
  log "Keel's native addon for the prebuilt Vulkan binary"
  "$NODE" scripts/build-native.mjs 2>&1 | tail -n 4
  wait
  OTHER="$NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --flash_attention false --max_queued_requests 4096 --target_device GPU"
  log "Keel on Vulkan, shared KV (keel) vs one stream per sequence (keel-kv-split), 8/32 streams"
  "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 128 --rounds 1 --concurrency 8,32 --threads 2 --keel-args "--kv_unified true" --other-cmd "$OTHER" --other-name keel-kv-split \
    --max-seconds 200 throughput 2>&1 | grep -v "^ggml_vulkan: \|^llama_" | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/compare-vulkan-kvu.log"
  tail -n 40 "$R/compare-vulkan-kvu.log"
  log "pipeline done"
  date -u > "$R/DONE"
  exit 0
fi

if [ "$PLAN" = vulkan ]; then
  # Vulkan only (no CUDA build): why Keel's getLlama({gpu: "auto"}) rejected the prebuilt Vulkan binary that
  # getLlama({gpu: "vulkan"}) loads, then Keel on Vulkan at 1/8/32 streams (both columns Keel on Vulkan).
  mkdir -p "$W/models"
  "$NODE" bench/gpu/write-model.mjs --out "$MODEL" --vocab 32000 --layers 24 --hidden 2048 --ff 5632 --heads 16 --kv-heads 8 --ctx 4096 --f16 || log "model write FAILED"
  for gpu in auto vulkan; do
    log "getLlama({gpu: \"$gpu\"}) with debug logs"
    NODE_LLAMA_CPP_DEBUG=true timeout 120 "$NODE" --input-type=module -e "
      const { getLlama } = await import('$W/node_modules/node-llama-cpp/dist/index.js');
      try { const l = await getLlama({ gpu: '$gpu', build: 'never', progressLogs: 'stderr', debug: true }); console.log('RESULT $gpu:', l.gpu, await l.getGpuDeviceNames()); }
      catch (e) { console.log('RESULT $gpu: failed', e.message); }" 2>&1 | grep -v "^ggml_vulkan: \|^llama_\|^load_tensors" | tail -n 40
  done
  OTHER="$NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --flash_attention false --max_queued_requests 4096 --target_device GPU"
  log "Keel on Vulkan, 1/8/32 streams"
  NODE_LLAMA_CPP_DEBUG=true "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 1 --concurrency 1,8,32 --threads 2 --other-cmd "$OTHER" --other-name keel-vulkan-2 \
    --max-seconds 200 throughput 2>&1 | grep -v "^ggml_vulkan: \|^llama_" | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/compare-vulkan.log"
  tail -n 40 "$R/compare-vulkan.log"
  log "pipeline done"
  date -u > "$R/DONE"
  exit 0
fi

# 1. Build (16 cores) while the model is written and the bandwidth measured.
log "build: source build --gpu cuda (tools + server on, FA kernels off)"
( env "${CUDA_ENV[@]}" "$NODE" node_modules/node-llama-cpp/dist/cli/cli.js source build --gpu cuda > "$R/build.log" 2>&1; echo "build exit $?" >> "$R/build.log" ) &
BUILD_PID=$!
mkdir -p "$W/models"
MODEL8B="$W/models/keel-llama3-8b-f16.gguf"
if [ "$PLAN" = diag ] || [ "$PLAN" = final ]; then
  # The 8 B-shaped model for the batch-1 roofline (Llama-3-8B's sizes, F16, 16 GB), written while the build runs.
  log "model: keel make-model --shape llama3-8b --f16 (background)"
  ( /usr/bin/time -v "$NODE" bin/keel.mjs make-model --shape llama3-8b --f16 --out "$MODEL8B" > "$R/model8b.log" 2>&1 ) &
  MODEL8B_PID=$!
fi
log "model: write-model.mjs"
"$NODE" bench/gpu/write-model.mjs --out "$MODEL" --vocab 32000 --layers 24 --hidden 2048 --ff 5632 --heads 16 --kv-heads 8 --ctx 4096 --f16 || log "model write FAILED"
if [ "$PLAN" = probe ]; then
  log "vulkan probe (prebuilt binary)"
  ( for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do [ -f "$f" ] && export VK_DRIVER_FILES="$f"; done
    NODE_LLAMA_CPP_DEBUG=true timeout 120 "$NODE" bench/gpu/vulkan-probe.mjs ) > "$R/vulkan-probe.log" 2>&1
  tail -n 15 "$R/vulkan-probe.log"
fi
log "bandwidth (torch, 4 GiB, 20 reps after 3 warm-ups)"
python3 bench/gpu/bandwidth.py > "$R/bandwidth.log" 2>&1
cat "$R/bandwidth.log"
wait "$BUILD_PID"
tail -n 3 "$R/build.log"
CUDA_DIR="$(build_dir cuda)"
LS="$(find "$CUDA_DIR" -name llama-server -type f -perm -u+x | head -1)"
BENCH="$(find "$CUDA_DIR" -name llama-bench -type f -perm -u+x | head -1)"
# The CUDA build's libraries reach the CUDA commands only (CUDA_ENV: llama-server, llama-bench, Keel on CUDA). A
# global LD_LIBRARY_PATH made every other process — Keel on the prebuilt Vulkan binary too — load this build's
# libggml instead of the one beside its own addon ($ORIGIN): the "Vulkan fails to load" of the first runs.
CUDA_ENV+=(LD_LIBRARY_PATH="$(lib_path "$CUDA_DIR")")
log "build done: llama-server=$LS llama-bench=$BENCH; folders: $(ls "$LB" | tr '\n' ' ')"

# 1b. Keel's native addon (one synchronous call samples a step; src/native) linked against that CUDA build's libraries
#     (and the prebuilt Vulkan directory's, if its headers are here): ~20 addon files, seconds on 16 cores. With the
#     CUDA options in the environment getLlama finds the local build, so the script builds for the directory the
#     engine will load. KEEL_NATIVE_SAMPLING=off on a Keel command gives node-llama-cpp's own addon (A/B).
log "Keel's native addon for the CUDA build"
env "${CUDA_ENV[@]}" "$NODE" scripts/build-native.mjs 2>&1 | tail -n 6

# 2. The engine alone at batch 1 (no server): tg = decode of 256 tokens after an empty prompt.
if [ -n "$BENCH" ]; then
  log "llama-bench batch-1 decode"
  env "${CUDA_ENV[@]}" "$BENCH" -m "$MODEL" -ngl 999 -fa 0 -p 0 -n 256 -r 3 -o md 2>&1 | grep -v "^ggml_\|^load" | tail -n 8
fi

# compare LOG ARGS...: compare.mjs with the CUDA build's environment, each line timestamped into $R/LOG, then shown.
compare() {
  local logfile="$1"; shift
  env "${CUDA_ENV[@]}" "$NODE" bench/compare.mjs --gpu "$@" 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/$logfile"
  cat "$R/$logfile"
}
# The 8 B-shaped model at batch 1 (the roofline): llama-bench, then Keel vs llama-server.
roofline_8b() {
  wait "$MODEL8B_PID"; tail -n 30 "$R/model8b.log" | grep -E "Elapsed|Maximum resident|bytes"; ls -la "$MODEL8B"
  log "llama-bench 8B batch-1 decode"
  env "${CUDA_ENV[@]}" "$BENCH" -m "$MODEL8B" -ngl 999 -fa 0 -p 0 -n 128 -r 2 -o md 2>&1 | grep -v "^ggml_\|^load" | tail -n 6 | tee "$R/bench-8b.log"
  log "compare 8B at 1 stream"
  compare compare-8b.log --model "$MODEL8B" --tokens 128 --rounds 2 --concurrency 1 --min-reqs 3 --reqs 3 --ctx 1024 --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 300 throughput
}
pipeline_done() {
  log "pipeline done"
  date -u > "$R/DONE"
  exit 0
}

if [ "$PLAN" = sync ]; then
  # S1. After the synchronous decode step (keelDecodeBatch): Keel vs llama-server at 1 and 8 streams (the budget left).
  log "compare CUDA throughput after the synchronous decode step"
  compare compare-cuda.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 1,8 --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 200 throughput
  pipeline_done
fi

if [ "$PLAN" = order ]; then
  # O1. After the slot-order fix (decode batches added to llama.cpp in sequence-id order): Keel vs llama-server.
  log "compare CUDA throughput after the slot-order fix"
  compare compare-cuda.log --model "$MODEL" --tokens 256 --rounds 1 --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 400 throughput
  pipeline_done
fi

if [ "$PLAN" = final ]; then
  KEEL_CMD="env ${CUDA_ENV[*]} $NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --flash_attention false --max_queued_requests 4096 --target_device GPU"
  # F1. Keel (its addon: one sampling call per step) vs llama-server, 1/8/32/64 streams.
  log "compare CUDA throughput (Keel with its addon vs llama-server)"
  compare compare-cuda.log --model "$MODEL" --tokens 256 --rounds 1 --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 420 throughput
  # F2. The same Keel with node-llama-cpp's addon (one async call per sequence): the batched sampling's own effect.
  log "A/B: Keel addon vs KEEL_NATIVE_SAMPLING=off"
  compare native-ab.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 8,32,64 --other-cmd "env KEEL_NATIVE_SAMPLING=off $KEEL_CMD" \
    --other-name keel-per-seq-sampling --max-seconds 300 throughput
  # F3. Keel without prefix caching vs llama-server at 8 and 64 streams (does reusing slots' KV cost decode time?).
  log "Keel --enable_prefix_caching false vs llama-server"
  compare nocache.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 8,64 --keel-args "--enable_prefix_caching false" --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 240 throughput
  # F4. The 8 B-shaped model at batch 1 (roofline): llama-bench, then Keel vs llama-server.
  roofline_8b
  pipeline_done
fi

if [ "$PLAN" = diag ]; then
  # D1. Where Keel's step time goes on the GPU (compare.mjs prints keel_engine_step_phase_seconds per round).
  log "compare CUDA throughput with Keel's step phases"
  compare compare-cuda.log --model "$MODEL" --tokens 256 --rounds 1 --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 400 throughput
  # D2. One Keel, 32 streams, with and without compare.mjs's 128-entry logit_bias (the open lead of the last run).
  log "bias A/B at 32 streams"
  env "${CUDA_ENV[@]}" "$NODE" bin/keel.mjs serve --model_path "$MODEL" --model_name bench --rest_port 8499 --rest_bind_address 127.0.0.1 \
    --max_num_seqs 32 --max_model_len 2048 --max_num_batched_tokens 256 --engine_threads 15 --flash_attention false --target_device GPU --log_level ERROR > "$R/keel-bias.log" 2>&1 &
  KB=$!
  for i in $(seq 120); do [ "$(curl -s -o /dev/null -w '%{http_code}' localhost:8499/v2/health/ready)" = 200 ] && break; sleep 1; done
  { timeout 200 "$NODE" bench/gpu/bias-ab.mjs --port 8499 --conc 32 --tokens 256 --rounds 2; curl -s localhost:8499/metrics | grep -E "^keel_engine_step_phase_seconds_(sum|count)|^keel_engine_step_requests_(sum|count)"; } > "$R/bias-ab.log" 2>&1
  kill "$KB"; wait "$KB" 2>/dev/null
  cat "$R/bias-ab.log"
  # D3. 8 B-shaped model at batch 1: llama-bench, then Keel vs llama-server (the roofline measurement).
  roofline_8b
  pipeline_done
fi

if [ "$PLAN" = probe ]; then
  # P1. V8 CPU profile of Keel's gateway and engine at 32 streams (per-token busy time, top functions).
  log "profile Keel at 32 streams"
  env "${CUDA_ENV[@]}" MODEL="$MODEL" REQS=64 TOKENS=256 CONCURRENCY=32 PROF_DIR=/tmp/keel-prof TOP=25 \
    KEEL_ARGS="--target_device GPU --engine_threads 15 --flash_attention false --max_num_batched_tokens 256" \
    timeout 240 "$NODE" bench/profile-keel.mjs > "$R/profile-c32.log" 2>&1
  head -n 60 "$R/profile-c32.log"
  # P2. Keel with 2 engine threads against Keel with 15 (what compare.mjs gave both servers on 16 cores).
  log "threads A/B: keel --engine_threads 2 vs 15"
  OTHER="env ${CUDA_ENV[*]} $NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads 15 --flash_attention false --max_queued_requests 4096 --target_device GPU"
  env "${CUDA_ENV[@]}" "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 2 --concurrency 8,32 --threads 2 --other-cmd "$OTHER" \
    --other-name keel-t15 --max-seconds 300 throughput 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/threads-ab.log"
  cat "$R/threads-ab.log"
  # P3. Keel vs llama-server with 2 threads each.
  log "compare CUDA throughput, 2 threads each"
  env "${CUDA_ENV[@]}" "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 2 --threads 2 --llama-server "$LS" \
    --other-args "--cache-ram 0" --max-seconds 400 throughput 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/compare-cuda-t2.log"
  cat "$R/compare-cuda-t2.log"
  # P4. Keel on Vulkan, only if the probe loaded the Vulkan backend.
  if grep -q "^2. getLlama: vulkan" "$R/vulkan-probe.log"; then
    for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do [ -f "$f" ] && export VK_DRIVER_FILES="$f"; done
    log "compare Vulkan (Keel vulkan vs Keel cuda)"
    OTHER="env ${CUDA_ENV[*]} $NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --flash_attention false --max_queued_requests 4096 --target_device GPU"
    "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 1 --concurrency 1,8,32 --threads 2 --other-cmd "$OTHER" --other-name keel-cuda \
      --max-seconds 300 throughput 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/compare-vulkan.log"
    cat "$R/compare-vulkan.log"
  fi
  log "pipeline done"
  date -u > "$R/DONE"
  exit 0
fi

# 3. Keel vs llama-server, CUDA, throughput.
nvidia-smi dmon -s u -o T -d 1 > "$R/dmon.log" 2>&1 &
DMON=$!
log "compare CUDA throughput (Keel vs llama-server --cache-ram 0)"
env "${CUDA_ENV[@]}" "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 3 --llama-server "$LS" \
  --other-args "--cache-ram 0" --max-seconds 900 throughput 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/compare-cuda.log"
cat "$R/compare-cuda.log"

# 4. Keel on Vulkan (the prebuilt binary; without the CUDA build options getLlama finds no CUDA build and falls back
#    to Vulkan) against Keel on CUDA (the other server, started with the CUDA options).
for f in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do [ -f "$f" ] && export VK_DRIVER_FILES="$f"; done
log "compare Vulkan (Keel vulkan vs Keel cuda), VK_DRIVER_FILES=${VK_DRIVER_FILES:-unset}"
OTHER="env ${CUDA_ENV[*]} $NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --flash_attention false --max_queued_requests 4096 --target_device GPU"
"$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 2 --concurrency 1,8,32 --other-cmd "$OTHER" --other-name keel-cuda \
  --max-seconds 600 throughput 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/compare-vulkan.log"
cat "$R/compare-vulkan.log"

# 5. Mixed load and disconnect storm on CUDA (Keel vs llama-server).
log "compare CUDA mixed + storm"
env "${CUDA_ENV[@]}" "$NODE" bench/compare.mjs --gpu --model "$MODEL" --tokens 256 --rounds 2 --llama-server "$LS" \
  --other-args "--cache-ram 0" --max-seconds 600 mixed storm 2>&1 | while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/mixed-storm.log"
cat "$R/mixed-storm.log"
kill "$DMON" 2>/dev/null
log "pipeline done"
date -u > "$R/DONE"
