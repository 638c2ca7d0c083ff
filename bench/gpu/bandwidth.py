# GPU memory bandwidth for the batch-1 roofline (run-h200.sh): a read-only sum and a device-to-device copy of a
# 4 GiB fp16 tensor, 20 timed repetitions after 3 warm-ups (torch, CUDA events).
import torch

n = 1 << 31  # 2^31 fp16 values = 4 GiB
a = torch.ones(n, dtype=torch.float16, device="cuda")
b = torch.empty_like(a)


def t(fn, reps=20):
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 1000 / reps


read = t(lambda: a.sum(dtype=torch.float32))
copy = t(lambda: b.copy_(a))
print(f"read-only (sum of 4 GiB): {2*n/read/1e12:.3f} TB/s; copy 4 GiB (read+write counted): {4*n/copy/1e12:.3f} TB/s")
print(torch.cuda.get_device_name(), torch.__version__)
