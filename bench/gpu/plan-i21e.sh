# Plan i21e of run-h200.sh (issue #21, a short follow-up of the fourth session), sourced by plan-i21.sh once the CUDA
# build is done (no Vulkan build, no 8 B model; uses step, compare, MODEL, LS). Device calls as plan i21's, with
# `start i21e`:
#   s. sampled requests (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 on both servers) at 8 and 64 streams (one round),
#      flash attention on: item 5's fused, threaded sampling, never measured on the H200;
#   t. the first token at 1 and 8 streams, flash attention on, 4 rounds (the cells left at 1.05 / 1.18 with 3).
step "s. sampled requests, 8/64 streams, flash attention on" 60 200 &&
  compare compare-sampled.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 8,64 --temperature 0.8 \
    --flash-attention on --llama-server "$LS" --other-args "--cache-ram 0" throughput
step "t. TTFT at 1 and 8 streams, flash attention on, 4 rounds" 70 150 &&
  compare compare-ttft.log --model "$MODEL" --tokens 256 --rounds 4 --concurrency 1,8 --flash-attention on \
    --llama-server "$LS" --other-args "--cache-ram 0" throughput
