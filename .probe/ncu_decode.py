"""ncu probe: the decode twin and the Triton decode, B=64, Qwen3-Next shape, after warm-up."""
import sys
import pmll_lab  # noqa: F401
import torch
from pmll_lab.gdn import gdn_decode, gdn_chain
from pmll_lab.inputs import gdn_inputs

B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
runs = []
for sdt in (torch.float32, torch.bfloat16):
    x = gdn_inputs(7, B, 16, 32, 128, 128, rows=4, dtype=torch.bfloat16)
    st = x["state"].transpose(-1, -2).contiguous().to(sdt)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    sel = x["state_indices"]
    for impl in ("cuda", "triton"):
        f = lambda impl=impl, st=st: gdn_decode(st, *(a[:, 0] for a in args), state_indices=sel,
                                                 state_layout="vk", impl=impl)
        c = lambda impl=impl, st=st: gdn_chain(st, *args, state_indices=sel, state_layout="vk", impl=impl)
        for _ in range(3):
            f(); c()
        runs.append((f, c))
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f, c in runs:
    f()
    c()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("done")
