# Plan i21f of run-h200.sh (issue #21, fifth session), sourced by plan-i21.sh once the CUDA build is done (no Vulkan
# build, no 8 B model; uses step, compare, MODEL, LS, CUDA_ENV, KEEL_SERVE). Device calls as plan i21's, with
# `start i21f`. The shared KV buffer (`--kv_unified true`; off by default until this plan runs): with one KV stream per sequence
# llama.cpp splits a batch into ubatches of consecutive sequences with equal token counts, so a step prefilling
# several prompts of different lengths ran as many small graphs (25-40 ms where one graph takes ~8).
#   k1. Keel (kv_unified on) vs llama-server (-np C, its default: one stream per slot) at 1/8/32/64, flash attention on;
#   k2. Keel with vs without it at 8/64, one round (the decode cost of attending over the shared buffer);
#   k3. Keel vs llama-server with --kv-unified at 8/32/64 (llama-server's own fastest first token).
step "k1. Keel (shared KV) vs llama-server at 1/8/32/64, flash attention on, 2 rounds" 90 220 &&
  compare compare-kvu.log --model "$MODEL" --tokens 256 --rounds 2 --concurrency 1,8,32,64 --flash-attention on \
    --keel-args "--kv_unified true" --llama-server "$LS" --other-args "--cache-ram 0" throughput
step "k2. Keel with vs without the shared KV buffer at 8/64, flash attention on" 60 150 &&
  compare compare-kvu-ab.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 8,64 --flash-attention on \
    --keel-args "--kv_unified true" --other-cmd "env ${CUDA_ENV[*]} $KEEL_SERVE --flash_attention true" --other-name keel-kv-split throughput
step "k3. Keel vs llama-server --kv-unified at 8/32/64, flash attention on" 60 150 &&
  compare compare-kvu-ls.log --model "$MODEL" --tokens 256 --rounds 1 --concurrency 8,32,64 --flash-attention on \
    --keel-args "--kv_unified true" --llama-server "$LS" --other-args "--cache-ram 0 -kvu" throughput
