# Plan i21d of run-h200.sh (issue #21, fourth session), sourced by plan-i21.sh once the CUDA build is done (no Vulkan
# build in this plan; uses step, compare, trace, roofline_8b, overlap_8b, MODEL, LS). Device
# calls as plan i21's, with `start i21d`. In order of what the issue needs most:
#   c. the 8 B batch-1 roofline again, now that greedy + logit_bias adds the biases in place (keel-sampling.cpp);
#   t. the TTFT timeline at 8 streams, flash attention off (the cell where Keel's TTFT p50 was 1.35x llama-server's)
#      and on (1.04x): each request's send / first token / end for both servers, and Keel's log at TRACE (one line per
#      engine step, each request's lifecycle), from COMPARE_TRACE (bench/compare.mjs);
#   o. the decode overlap on the 8 B model.

roofline_8b

step "t1. TTFT timeline, 8 streams, flash attention off" 70 150 && trace trace-c8-fa-off off
step "t2. TTFT timeline, 8 streams, flash attention on" 70 150 && trace trace-c8-fa-on on

overlap_8b "o."
