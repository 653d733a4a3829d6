# The two ceilings every figure in docs/PERF.md is read against, measured with torch on the GPU machine:
# device-to-device copy bandwidth (bytes read + written) and the dense bf16 matmul rate. Used by
# `bench/device.sh probe`.
import torch

x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def median_ms(fn, n=10):
    ts = []
    for _ in range(n):
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2]


ms = median_ms(lambda: y.copy_(x))
print(f"copy: {2 * x.numel() / ms / 1e6:.0f} GB/s (read + write, 2 GiB, median of 10)")
del x, y
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
b = torch.randn_like(a)
for _ in range(3):
    a @ b
ms = median_ms(lambda: a @ b)
print(f"bf16 matmul 8192^3: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s (median of 10)")
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
