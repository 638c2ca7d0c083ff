# Plan i21c of run-h200.sh: the decode overlap A/B within 10 minutes of device time (what a session had left), sourced
# by its pipeline (cwd $W; uses W R NODE MODEL CUDA_ENV log build_dir lib_path). Flash attention kernels compiled out
# (the build takes ~3:45 on 16 cores instead of ~5:30), so both servers run with flash attention off — the issue's own
# setting. Device calls: `BUDGET=470 bash .gpucarry/run-h200.sh start i21c` (carry [".gpucarry"], timeout_s 500); the
# pipeline stops starting steps I21C_SECONDS (default 400) after it began, and DONE is written when it ends.
T_END=$(( $(date +%s) + ${I21C_SECONDS:-400} ))
left() { echo $(( T_END - $(date +%s) )); }
stamp() { while IFS= read -r l; do echo "$(date -u +%T) $l"; done > "$R/$1"; cat "$R/$1"; }
KEEL_SERVE="$NODE bin/keel.mjs serve --model_path {model} --model_name bench --rest_port {port} --rest_bind_address 127.0.0.1 --log_format json --max_num_seqs {slots} --max_model_len {ctx} --max_num_batched_tokens {batch} --engine_threads {threads} --max_queued_requests 4096 --target_device GPU"
log "build: CUDA (flash attention kernels off), the 1.26 B model meanwhile"
( env "${CUDA_ENV[@]}" "$NODE" node_modules/node-llama-cpp/dist/cli/cli.js source build --gpu cuda > "$R/build-cuda.log" 2>&1; echo "build exit $?" >> "$R/build-cuda.log" ) &
CUDA_PID=$!
mkdir -p "$W/models"
"$NODE" bench/gpu/write-model.mjs --out "$MODEL" --vocab 32000 --layers 24 --hidden 2048 --ff 5632 --heads 16 --kv-heads 8 --ctx 4096 --f16 || log "model write FAILED"
wait "$CUDA_PID"
tail -n 2 "$R/build-cuda.log"
CUDA_DIR="$(build_dir cuda)"
LS="$(find "$CUDA_DIR" -name llama-server -type f -perm -u+x | head -1)"
CUDA_ENV+=(LD_LIBRARY_PATH="$(lib_path "$CUDA_DIR")")
log "CUDA build done: llama-server=$LS ($(left) s left); Keel's addon"
env "${CUDA_ENV[@]}" "$NODE" scripts/build-native.mjs 2>&1 | tail -n 2
compare() { local f="$1" lim; lim=$(left); shift; [ "$lim" -gt 40 ] || { log "SKIPPED $f: $lim s left"; return 0; }
  log "$f ($lim s left)"; env "${CUDA_ENV[@]}" timeout "$lim" "$NODE" bench/compare.mjs --gpu --max-seconds $((lim - 5)) "$@" 2>&1 | stamp "$f"; }
# 1. Keel with the decode overlap (keel: KEEL_DECODE_OVERLAP=on) vs Keel without it, 1/8/64 streams, one round.
KEEL_DECODE_OVERLAP=on compare overlap-1b.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 1,8,64 \
  --other-cmd "env ${CUDA_ENV[*]} KEEL_DECODE_OVERLAP=off $KEEL_SERVE" --other-name keel-no-overlap throughput
# 2. Keel (its default: no overlap) vs llama-server (same build), 1/8/32/64, one round, flash attention off on both.
compare compare-cuda-fa-off.log --model "$MODEL" --tokens 256 --rounds 1 --llama-server "$LS" --other-args "--cache-ram 0" throughput
log "pipeline done"
date -u > "$R/DONE"
