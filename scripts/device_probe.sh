#!/usr/bin/env bash
# First call on a GPU machine: what is there, does the carried build work, and the two ceilings.
set -uo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
cmake --version | head -1; nvcc --version | tail -1; g++ --version | head -1; ninja --version
which ncu compute-sanitizer cuobjdump; ldconfig -p | grep -E "cublasLt|libssl|brotli|libz\.so" | head
time bash scripts/device_build.sh kiln test_core && ./build/device/tests/test_core | tail -3 && ./build/device/bin/kiln version
ldd build/device/bin/kiln | grep -E "not found|httplib|cublas"
python3 - <<'PY'
import torch, time
x = torch.empty(2*1024**3, dtype=torch.uint8, device='cuda'); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
ts=[]
for _ in range(10):
    s.record(); y.copy_(x); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); print(f"copy: {2*x.numel()/ts[5]/1e6:.0f} GB/s (read+write, median of 10, 2 GiB)")
a=torch.randn(8192,8192,dtype=torch.bfloat16,device='cuda'); b=torch.randn_like(a)
for _ in range(3): a@b
ts=[]
for _ in range(10):
    s.record(); a@b; e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); print(f"bf16 matmul 8192^3: {2*8192**3/ts[5]/1e9:.0f} TFLOP/s (median of 10)")
import transformers, tokenizers; print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__)
PY
