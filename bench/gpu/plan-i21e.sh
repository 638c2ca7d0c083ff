# Plan i21e of run-h200.sh (issue #21, a short follow-up of the fourth session), sourced by plan-i21.sh once the CUDA
# build is done (no Vulkan build, no 8 B model; uses step, compare, trace, MODEL, LS, CUDA_ENV). Device calls as plan
# i21's, with `start i21e`:
#   s. sampled requests (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 on both servers) at 8 and 64 streams (one
#      round), flash attention on: item 5's fused, threaded sampling, never measured on the H200;
#   t. the first token at 1 and 8 streams, 4 rounds, flash attention on and off (the cells left at 1.05 / 1.08 / 1.18
#      with 3 rounds), now that a turn's adds reach the engine in one write;
#   u. the 8-stream timeline with flash attention on again (admissions per step with that write);
#   v. Keel's first token by phase at 1 and 8 streams (bench/ttft-phases.mjs), flash attention on.
step "s. sampled requests, 8/64 streams, flash attention on" 60 200 &&
  compare compare-sampled.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 8,64 --temperature 0.8 \
    --flash-attention on --llama-server "$LS" --other-args "--cache-ram 0" throughput
step "t1. TTFT at 1 and 8 streams, flash attention on, 4 rounds" 70 150 &&
  compare compare-ttft-on.log --model "$MODEL" --tokens 256 --rounds 4 --concurrency 1,8 --flash-attention on \
    --llama-server "$LS" --other-args "--cache-ram 0" throughput
step "t2. TTFT at 1 and 8 streams, flash attention off, 4 rounds" 70 150 &&
  compare compare-ttft-off.log --model "$MODEL" --tokens 256 --rounds 4 --concurrency 1,8 --flash-attention off \
    --llama-server "$LS" --other-args "--cache-ram 0" throughput
step "u. TTFT timeline, 8 streams, flash attention on" 70 150 && trace trace-c8-fa-on on
step "v. Keel's first token by phase, 1 and 8 streams, flash attention on" 40 90 &&
  env "${CUDA_ENV[@]}" timeout "$LIM" "$NODE" bench/ttft-phases.mjs --model "$MODEL" --concurrency 1,8 --rounds 30 \
    --prompt-words 14 --args "--target_device GPU --max_num_batched_tokens 256 --flash_attention true" 2>&1 | stamp phases.log
