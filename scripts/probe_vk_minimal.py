"""Where the V-major decode and chain lose to the copy roofline: a minimal V-major chain kernel
(a flat ``[BR, kd]`` tile per program, inputs loaded in the row loop, nothing else) timed beside
the library's ``gdn_chain`` / ``gdn_decode`` (``state_layout="vk"``) on the same inputs, with
the features the library's kernel adds switched on one at a time (l2norm of q/k in the kernel,
the slot table, the padding-lane masks), per tile (rows x warps).

Not a library kernel: no bitwise contract with decode, no padding lanes, no gating. Each variant
is checked before it is timed: its outputs and final state against the library's on the same
inputs (with or without the l2norm, as the variant), max abs error at most ``--max-err``; a
variant that fails is reported and not timed. Both launch as the library's exact family does
(``recurrence.EXACT_LAUNCH``: no FMA contraction by the compiler; the log of 2026-11-30 in
``reports/h200x2-2026-11-30d/logs/`` predates that and had contraction on for both). CUDA-graph replay (``bench.time_cuda_graph``, L2 flushed), median
of 200 replays; HK=16, HV=32, kd=vd=128, bf16 inputs, fp32 state.
Usage on a GPU:  python3 scripts/probe_vk_minimal.py [--B 64,128,256] [--json PATH]
(CPU: ``--smoke`` runs one tiny case under the interpreter, checking outputs only).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401  (first: GPU or the Triton interpreter)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pmll_lab.backend import DEVICE, device_name  # noqa: E402
from pmll_lab.bench import copy_bandwidth, time_cuda_graph  # noqa: E402
from pmll_lab.gdn import gdn_chain, gdn_decode  # noqa: E402
from pmll_lab.inputs import gdn_inputs  # noqa: E402
from pmll_lab.ops.gdn.recurrence import EXACT_LAUNCH  # noqa: E402


@triton.jit
def mini_chain_vk(state, q, k, v, g, beta, o, inter, idx, scale, HV, HK, GROUP,
                  K: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, BR: tl.constexpr,
                  L2: tl.constexpr, IDX: tl.constexpr, MASK: tl.constexpr,
                  STORE_INTER: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_r = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    hk = hv // GROUP
    if IDX:
        slot = tl.load(idx + b).to(tl.int64)
    else:
        slot = b.to(tl.int64)
    live = slot >= 0
    slot = tl.maximum(slot, 0)
    rr = pid_r * BR + tl.arange(0, BR)
    rk = tl.arange(0, KD)
    offs = rr[:, None] * KD + rk[None, :]
    p_h = state + (slot * HV + hv) * (VD * KD) + offs
    if MASK:
        mh = (rr[:, None] < VD) & (rk[None, :] < KD) & live
        h = tl.load(p_h, mask=mh, other=0.0)
    else:
        h = tl.load(p_h)
    b64 = b.to(tl.int64)
    for t in tl.static_range(K):
        row = b64 * K + t
        qt = tl.load(q + (row * HK + hk) * KD + rk).to(tl.float32)
        kt = tl.load(k + (row * HK + hk) * KD + rk).to(tl.float32)
        vt = tl.load(v + (row * HV + hv) * VD + rr).to(tl.float32)
        gt = tl.load(g + row * HV + hv)
        bt = tl.load(beta + row * HV + hv)
        if L2:
            qt = qt / tl.sqrt(tl.sum(qt * qt, 0) + 1e-6)
            kt = kt / tl.sqrt(tl.sum(kt * kt, 0) + 1e-6)
        qt = qt * scale
        h = h * tl.exp(gt)
        u = (vt - tl.sum(h * kt[None, :], 1)) * bt
        h = h + u[:, None] * kt[None, :]
        ot = tl.sum(h * qt[None, :], 1)
        tl.store(o + (row * HV + hv) * VD + rr, ot.to(o.dtype.element_ty))
        if STORE_INTER:
            if t < K - 1:
                p_i = inter + ((b64 * (K - 1) + t) * HV + hv) * (VD * KD) + offs
                if MASK:
                    tl.store(p_i, h, mask=mh)
                else:
                    tl.store(p_i, h)
    if MASK:
        tl.store(p_h, h, mask=mh)
    else:
        tl.store(p_h, h)


def vk(x):
    return x.transpose(-1, -2).contiguous()


def case(B, K, kd=128, HK=16, HV=32, seed=0):
    x = gdn_inputs(seed, B, HK, HV, kd, kd, rows=K if K > 1 else None, slots=B,
                   dtype=torch.bfloat16)
    if K == 1:                      # one-row inputs as K=1 rows for the minimal kernel
        for n in ("q", "k", "v", "g", "beta"):
            x[n] = x[n].unsqueeze(1)
    x["state"] = vk(x["state"])
    x["state_indices"] = torch.arange(B, dtype=torch.int32, device=DEVICE)
    return x


def run_mini(x, st, o, inter, BR, warps, L2, IDX, MASK):
    B, K, HK, kd = x["q"].shape
    HV = x["v"].shape[2]
    grid = (B * HV, triton.cdiv(kd, BR))
    mini_chain_vk[grid](st, x["q"], x["k"], x["v"], x["g"], x["beta"], o, inter,
                        x["state_indices"], kd ** -0.5, HV, HK, HV // HK, K=K, KD=kd, VD=kd,
                        BR=BR, L2=L2, IDX=IDX, MASK=MASK, STORE_INTER=K > 1, num_warps=warps,
                        **EXACT_LAUNCH)


def run_lib(x, st, inter, l2=True):
    if x["q"].shape[1] == 1:
        return gdn_decode(st, *(x[n][:, 0] for n in ("q", "k", "v", "g", "beta")),
                          state_indices=x["state_indices"], state_layout="vk",
                          use_qk_l2norm=l2)
    return gdn_chain(st, x["q"], x["k"], x["v"], x["g"], x["beta"],
                     state_indices=x["state_indices"], intermediate=inter, state_layout="vk",
                     use_qk_l2norm=l2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", default="64,128,256")
    ap.add_argument("--K", default="1,4")
    ap.add_argument("--tiles", default="4x1,8x1,16x1,16x2,32x2,32x4")
    ap.add_argument("--max-err", type=float, default=1e-3,
                    help="largest max-abs difference from the library a variant may show")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        Bs, Ks, tiles, kd = [2], [1, 3], [(8, 1)], 16
    else:
        Bs = [int(s) for s in a.B.split(",")]
        Ks = [int(s) for s in a.K.split(",")]
        tiles = [tuple(int(p) for p in t.split("x")) for t in a.tiles.split(",")]
        kd = 128
    bw = copy_bandwidth()
    print(f"# {device_name()}  copy {bw} GB/s", flush=True)
    out = []
    for K in Ks:
        for B in Bs:
            x = case(B, K, kd=kd, HK=2 if a.smoke else 16, HV=4 if a.smoke else 32)
            HV = x["v"].shape[2]
            nbytes = x["state"].numel() * 4 * (2 + (K - 1))  # state in + out + K-1 snapshots
            floor = nbytes / (bw * 1e3) if bw else None
            inter = (torch.empty(B, K - 1, *x["state"].shape[1:], device=DEVICE)
                     if K > 1 else torch.empty(1, device=DEVICE))
            ref = {}
            for l2 in (True, False):             # the library's outputs and state, per l2norm
                st_l = x["state"].clone()
                o_l = run_lib(x, st_l, inter if K > 1 else None, l2)
                ref[l2] = (o_l if K > 1 else o_l.unsqueeze(1), st_l)
            variants = [("lib", None)]
            for BR, W in tiles:
                variants += [(f"mini {BR}x{W}", (BR, W, True, False, False)),
                             (f"mini {BR}x{W} +idx+mask", (BR, W, True, True, True)),
                             (f"mini {BR}x{W} -l2", (BR, W, False, False, False))]
            for name, cfg in variants:
                st = x["state"].clone()
                o = torch.empty(B, K, HV, kd, dtype=torch.bfloat16, device=DEVICE)
                if cfg is None:
                    def fn(st=st):
                        run_lib(x, st, inter if K > 1 else None)
                    err = 0.0
                else:
                    def fn(st=st, o=o, cfg=cfg):
                        run_mini(x, st, o, inter, *cfg)
                    st2 = x["state"].clone()
                    run_mini(x, st2, o, inter, *cfg)
                    o_r, st_r = ref[cfg[2]]
                    err = max((o.float() - o_r.float()).abs().max().item(),
                              (st2 - st_r).abs().max().item())
                row = dict(K=K, B=B, variant=name, max_err=err, us=None, roofline_frac=None)
                out.append(row)
                if err > a.max_err:
                    print(f"K={K} B={B:4d} {name:24s} FAILED its check (max err {err:.2e} > "
                          f"{a.max_err:.0e}): not timed", flush=True)
                    continue
                t = time_cuda_graph(fn)
                us = t["median_us"] if t else None
                frac = floor / us if (us and floor) else None
                row.update(us=us, roofline_frac=frac)
                print(f"K={K} B={B:4d} {name:24s} "
                      + (f"{us:8.1f} us  {frac:5.3f}" if us else "   (cpu)   ")
                      + f"  err {err:.2e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
