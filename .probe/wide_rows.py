"""Probe: the GDN twins built with PMLL_GDN_WIDE_ROWS = 2 against the default (4) and Triton:
decode and chain (K=4, 3 snapshots), B in 64/128/256, fp32 and bf16 state, graph replay.
Every variant's outputs and states checked bitwise against the default build first (the sums
are the same, only the rows per group differ)."""
import os
import pmll_lab  # noqa: F401
import torch
from torch.utils import cpp_extension
from pmll_lab import cuda_ext
from pmll_lab.bench import time_cuda_graph
from pmll_lab.gdn import gdn_decode, gdn_chain
from pmll_lab.inputs import gdn_inputs

K_DIR = cuda_ext.KERNELS_DIR
SRC = [str(K_DIR / s) for s in cuda_ext.TWINS["gdn_decode"]]
mods = {"w4": cuda_ext.load("gdn_decode")}
for w in (2,):
    d = f"/tmp/gdn_w{w}"
    os.makedirs(d, exist_ok=True)
    mods[f"w{w}"] = cpp_extension.load(
        name=f"gdn_w{w}", sources=SRC, extra_include_paths=[str(K_DIR)], extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a",
                           f"-DPMLL_GDN_WIDE_ROWS={w}"], build_directory=d, with_cuda=True)
print("built", list(mods))
for sdt in (torch.float32, torch.bfloat16):
    for B in (64, 128):
        x = gdn_inputs(7 + B, B, 16, 32, 128, 128, rows=4, dtype=torch.bfloat16)
        st0 = x["state"].transpose(-1, -2).contiguous().to(sdt)
        q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
        sel = x["state_indices"]
        inter = torch.empty(B, 3, 32, 128, 128, dtype=sdt, device=st0.device)
        res = {}
        for name, m in mods.items():
            st = st0.clone()
            o1 = torch.empty(B, 32, 128, dtype=q.dtype, device=q.device)
            o4 = torch.empty(B, 4, 32, 128, dtype=q.dtype, device=q.device)
            dec = lambda: m.gdn_decode_vk(st, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], o1, 128 ** -0.5, True, state_indices=sel)
            ch = lambda: m.gdn_chain_vk(st, q, k, v, g, beta, o4, 128 ** -0.5, True, intermediate=inter, state_indices=sel)
            dec(); s1 = st.clone(); ch()
            res[name] = (o1.clone(), s1, o4.clone(), st.clone(), inter.clone())
            td = time_cuda_graph(dec, replays=100)["median_us"]
            tc = time_cuda_graph(ch, replays=100)["median_us"]
            print(f"{str(sdt)[6:]:9s} B={B:4d} {name}: decode {td:8.2f} us  chain {tc:8.2f} us", flush=True)
        same = all(torch.equal(a, b) for a, b in zip(res["w4"], res["w2"]))
        print(f"   w2 bitwise w4: {same}")
        for impl in ("triton",):
            st = st0.clone()
            td = time_cuda_graph(lambda: gdn_decode(st, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state_indices=sel, state_layout="vk"), replays=100)["median_us"]
            tc = time_cuda_graph(lambda: gdn_chain(st, q, k, v, g, beta, state_indices=sel, intermediate=inter, state_layout="vk"), replays=100)["median_us"]
            print(f"{str(sdt)[6:]:9s} B={B:4d} triton: decode {td:8.2f} us  chain {tc:8.2f} us", flush=True)
