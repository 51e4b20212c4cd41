"""Decompositions of the V-major decode and K-row chain that might stream closer to the copy
roofline: a probe kernel built from the library's own row helpers (``gdn_row_vk``,
``qk_prepare_vk``), so a variant with the library's tile (chunked ``[BR, 4, 32]``) must equal
``gdn_decode`` / ``gdn_chain(state_layout="vk")`` bit for bit, and the others differ only in
the order of the sums over keys. Knobs, one at a time:

- tile: ``f`` flat (``[BR, 1, kd]``: 32 lanes over the keys, a 5-step shuffle tree per row) or
  ``c`` chunked (``[BR, kd/32, 32]``: the library's), ``BR`` value rows, warps;
- ``loopN``: a program walks ``N`` tiles of its head (grid shrinks N-fold); ``pf``: the next
  tile's state is loaded before this tile's rows run (a register double buffer, so the load of
  tile i+1 is in flight during tile i's arithmetic and stores); ``sS``: ``tl.range`` with
  ``num_stages=S`` instead;
- ``cs``: state loads ``evict_first``, state and snapshot stores ``.cs`` (streaming);
- ``tma``: the state tile loaded through a tensor descriptor (TMA on sm_90), ``tmas`` stored
  through it too (and the snapshots); ``swap``: grid axes swapped, so consecutive programs walk
  one head's value rows; ``rN``: the compiler held to ``N`` registers per thread (``maxnreg``).

Each variant is checked before it is timed (outputs and final state against the library's,
max abs error at most ``--max-err``; "bitwise" printed when they are equal), then timed by
CUDA-graph replay (``bench.time_cuda_graph``, L2 flushed, median of 200), launched as the
library's exact family (``EXACT_LAUNCH``). HK=16, HV=32, kd=vd=128, bf16 inputs, fp32 state.
The roofline fraction counts the state read once and written once plus ``K-1`` snapshots.
Usage on a GPU:  python3 scripts/probe_vk_stream.py [--B 64,256] [--K 1,4] [--json PATH]
(CPU: ``--smoke`` runs tiny cases under the interpreter, checking only).
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
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from pmll_lab.backend import DEVICE, device_name  # noqa: E402
from pmll_lab.bench import bitwise_equal, copy_bandwidth, time_cuda_graph  # noqa: E402
from pmll_lab.gdn import gdn_chain, gdn_decode  # noqa: E402
from pmll_lab.ops.gdn.recurrence import EXACT_LAUNCH, gdn_row_vk, qk_prepare_vk  # noqa: E402
from probe_vk_minimal import case  # noqa: E402  (the same inputs as the minimal-kernel probe)


@triton.jit
def _load_h(p, i, TPP: tl.constexpr, CS: tl.constexpr):
    m = i < TPP
    if CS:
        return tl.load(p, mask=m, other=0.0, eviction_policy="evict_first")
    return tl.load(p, mask=m, other=0.0)


@triton.jit
def _store(p, x, CS: tl.constexpr):
    if CS:
        tl.store(p, x, cache_modifier=".cs")
    else:
        tl.store(p, x)


@triton.jit
def _tile_rows(h, rr, rk, b64, hv, hk, q, k, v, g, beta, o, inter, scale, HV, HK,
               K: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, CS: tl.constexpr,
               STORE_INTER: tl.constexpr, idd=None, r0=0, TMA: tl.constexpr = 0,
               BR: tl.constexpr = 8):
    b = b64.to(tl.int32)
    for t in tl.static_range(K):
        row = b64 * K + t
        qt = tl.load(q + (row * HK + hk) * KD + rk).to(tl.float32)
        kt = tl.load(k + (row * HK + hk) * KD + rk).to(tl.float32)
        vt = tl.load(v + (row * HV + hv) * VD + rr).to(tl.float32)
        gt = tl.load(g + row * HV + hv).to(tl.float32)
        bt = tl.load(beta + row * HV + hv).to(tl.float32)
        qt, kt = qk_prepare_vk(qt, kt, scale, True)
        h, ot, ut = gdn_row_vk(h, qt, kt, vt, gt, bt)
        tl.store(o + (row * HV + hv) * VD + rr, ot.to(o.dtype.element_ty))
        if STORE_INTER:
            if t < K - 1 and TMA >= 2:
                idd.store([(((b * (K - 1) + t) * HV + hv) * VD + r0).to(tl.int32), 0],
                          tl.reshape(h, [BR, KD]))
            elif t < K - 1:
                p_i = (inter + ((b64 * (K - 1) + t) * HV + hv) * (VD * KD)
                       + rr[:, None, None] * KD + rk[None, :, :])
                _store(p_i, h, CS)
    return h


@triton.jit
def stream_vk(state, q, k, v, g, beta, o, inter, idx, scale, HV, HK, GROUP,
              K: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, BR: tl.constexpr,
              NC: tl.constexpr, CW: tl.constexpr, TPP: tl.constexpr, PREFETCH: tl.constexpr,
              STAGES: tl.constexpr, CS: tl.constexpr, STORE_INTER: tl.constexpr,
              sd=None, idd=None, TMA: tl.constexpr = 0, SWAP: tl.constexpr = False):
    if SWAP:                         # consecutive programs walk one head's value rows
        pid_bh = tl.program_id(1)
        pid_r = tl.program_id(0)
    else:                            # consecutive programs take one tile of successive heads
        pid_bh = tl.program_id(0)
        pid_r = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    hk = hv // GROUP
    b64 = b.to(tl.int64)
    slot = tl.load(idx + b).to(tl.int64)
    rk = tl.arange(0, NC)[:, None] * CW + tl.arange(0, CW)[None, :]
    rl = tl.arange(0, BR)
    base = state + (slot * HV + hv) * (VD * KD)
    r0 = pid_r * (BR * TPP)
    if PREFETCH:
        h = _load_h(base + (r0 + rl)[:, None, None] * KD + rk[None, :, :], 0, TPP, CS)
        for i in range(TPP):
            rr = r0 + i * BR + rl
            offs = rr[:, None, None] * KD + rk[None, :, :]
            hn = _load_h(base + offs + BR * KD, i + 1, TPP, CS)
            h = _tile_rows(h, rr, rk, b64, hv, hk, q, k, v, g, beta, o, inter, scale, HV, HK,
                           K, KD, VD, CS, STORE_INTER)
            _store(base + offs, h, CS)
            h = hn
    elif TMA:                         # the state through tensor descriptors (TMA on sm_90)
        for i in tl.range(TPP, num_stages=STAGES):
            rr = r0 + i * BR + rl
            row0 = ((slot * HV + hv) * VD + r0 + i * BR).to(tl.int32)
            h = tl.reshape(sd.load([row0, 0]), [BR, NC, CW])
            h = _tile_rows(h, rr, rk, b64, hv, hk, q, k, v, g, beta, o, inter, scale, HV, HK,
                           K, KD, VD, CS, STORE_INTER, idd, r0 + i * BR, TMA, BR)
            if TMA >= 2:
                sd.store([row0, 0], tl.reshape(h, [BR, KD]))
            else:
                _store(base + rr[:, None, None] * KD + rk[None, :, :], h, CS)
    else:
        for i in tl.range(TPP, num_stages=STAGES):
            rr = r0 + i * BR + rl
            offs = rr[:, None, None] * KD + rk[None, :, :]
            h = _load_h(base + offs, 0, TPP, CS)
            h = _tile_rows(h, rr, rk, b64, hv, hk, q, k, v, g, beta, o, inter, scale, HV, HK,
                           K, KD, VD, CS, STORE_INTER)
            _store(base + offs, h, CS)


def parse_variant(name):
    """``f16x1`` / ``c8x1`` + optional ``-loop4`` ``-pf`` ``-s3`` ``-cs`` -> launch kwargs."""
    parts = name.split("-")
    tile = parts[0]
    br, warps = (int(s) for s in tile[1:].split("x"))
    cfg = dict(layout=tile[0], BR=br, warps=warps, TPP=1, PREFETCH=False, STAGES=1, CS=False,
               TMA=0, SWAP=False, maxnreg=None)
    for p in parts[1:]:
        if p.startswith("loop"):
            cfg["TPP"] = int(p[4:])
        elif p == "pf":
            cfg["PREFETCH"] = True
        elif p.startswith("r"):
            cfg["maxnreg"] = int(p[1:])
        elif p == "swap":
            cfg["SWAP"] = True
        elif p.startswith("s"):
            cfg["STAGES"] = int(p[1:])
        elif p == "tma":
            cfg["TMA"] = 1
        elif p == "tmas":
            cfg["TMA"] = 2
        elif p == "cs":
            cfg["CS"] = True
        else:
            raise ValueError(f"variant {name!r}: unknown part {p!r}")
    return cfg


def run_stream(x, st, o, inter, cfg):
    B, K, HK, kd = x["q"].shape
    HV = x["v"].shape[2]
    nc, cw = (1, kd) if cfg["layout"] == "f" else (max(1, kd // 32), min(kd, 32))
    grid = (B * HV, triton.cdiv(kd, cfg["BR"] * cfg["TPP"]))
    tma = dict(SWAP=True) if cfg["SWAP"] else {}
    if cfg["SWAP"]:
        grid = grid[::-1]
    if cfg["TMA"]:
        tma.update(sd=TensorDescriptor.from_tensor(st.view(-1, kd), [cfg["BR"], kd]),
                   idd=TensorDescriptor.from_tensor(inter.view(-1, kd), [cfg["BR"], kd])
                   if K > 1 else None, TMA=cfg["TMA"])
    stream_vk[grid](st, x["q"], x["k"], x["v"], x["g"], x["beta"], o, inter,
                    x["state_indices"], kd ** -0.5, HV, HK, HV // HK, K=K, KD=kd, VD=kd,
                    BR=cfg["BR"], NC=nc, CW=cw, TPP=cfg["TPP"], PREFETCH=cfg["PREFETCH"],
                    STAGES=cfg["STAGES"], CS=cfg["CS"], STORE_INTER=K > 1,
                    num_warps=cfg["warps"], **tma, **EXACT_LAUNCH,
                    **({"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] else {}))


def run_lib(x, st, inter):
    if x["q"].shape[1] == 1:
        return gdn_decode(st, *(x[n][:, 0] for n in ("q", "k", "v", "g", "beta")),
                          state_indices=x["state_indices"], state_layout="vk").unsqueeze(1)
    return gdn_chain(st, x["q"], x["k"], x["v"], x["g"], x["beta"],
                     state_indices=x["state_indices"], intermediate=inter, state_layout="vk")


DEFAULT = ("c8x1,f8x1,f16x1,c16x1,f16x1-cs,c8x1-cs,f16x1-loop2-pf,f16x1-loop4-pf,"
           "f16x1-loop8-pf,f8x1-loop4-pf,c8x1-loop4-pf,f16x1-loop4-s3,f32x2,f32x4-loop2-pf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", default="64,256")
    ap.add_argument("--K", default="1,4")
    ap.add_argument("--B1", action="store_true", help="also B=1 at each K")
    ap.add_argument("--variants", default=DEFAULT)
    ap.add_argument("--max-err", type=float, default=1e-3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--slots", type=int, default=0,
                    help="a pool of this many slots, the batch on a seeded permutation of them "
                         "(the notebooks' inputs); 0: B slots in order")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    kd, HK, HV = (32, 2, 4) if a.smoke else (128, 16, 32)
    Bs = [2] if a.smoke else [int(s) for s in a.B.split(",")]
    if a.B1 and not a.smoke:
        Bs = [1] + Bs
    Ks = [1, 3] if a.smoke else [int(s) for s in a.K.split(",")]
    variants = a.variants.split(",")
    if a.smoke:   # rows x loop must fit kd=32
        variants = [v.replace("loop8", "loop2").replace("loop4", "loop2").replace("f32", "f16")
                    for v in variants]
    bw = copy_bandwidth()
    print(f"# {device_name()}  copy {bw} GB/s", flush=True)
    out = []
    for K in Ks:
        for B in Bs:
            x = case(B, K, kd=kd, HK=HK, HV=HV)
            if a.slots:
                pool = case(max(a.slots, B), K, kd=kd, HK=HK, HV=HV)
                x["state"] = pool["state"]
                x["state_indices"] = torch.randperm(
                    pool["state"].shape[0], generator=torch.Generator().manual_seed(B)
                )[:B].to(torch.int32).to(DEVICE)
            nbytes = B * x["state"][0].numel() * 4 * (2 + (K - 1))
            floor = nbytes / (bw * 1e3) if bw else None
            inter = (torch.empty(B, K - 1, *x["state"].shape[1:], device=DEVICE)
                     if K > 1 else torch.empty(1, device=DEVICE))
            st_l = x["state"].clone()
            o_l = run_lib(x, st_l, inter if K > 1 else None)
            inter_l = inter.clone()
            for name in ["lib"] + variants:
                st = x["state"].clone()
                o = torch.empty(B, K, HV, kd, dtype=torch.bfloat16, device=DEVICE)
                if name == "lib":
                    def fn(st=st):
                        run_lib(x, st, inter if K > 1 else None)
                    err, bits = 0.0, True
                else:
                    cfg = parse_variant(name)
                    if kd % (cfg["BR"] * cfg["TPP"]):
                        continue

                    def fn(st=st, o=o, cfg=cfg):
                        run_stream(x, st, o, inter, cfg)
                    st2 = x["state"].clone()
                    inter.zero_()
                    run_stream(x, st2, o, inter, cfg)
                    err = max((o.float() - o_l.float()).abs().max().item(),
                              (st2 - st_l).abs().max().item(),
                              (inter - inter_l).abs().max().item() if K > 1 else 0.0)
                    bits = (bitwise_equal(o, o_l) and bitwise_equal(st2, st_l)
                            and (K == 1 or bitwise_equal(inter, inter_l)))
                row = dict(K=K, B=B, variant=name, max_err=err, bitwise=bits, us=None,
                           roofline_frac=None)
                out.append(row)
                if not err <= a.max_err:
                    print(f"K={K} B={B:4d} {name:22s} FAILED its check (max err {err:.2e}): "
                          "not timed", flush=True)
                    continue
                t = time_cuda_graph(fn)
                us = t["median_us"] if t else None
                frac = floor / us if (us and floor) else None
                row.update(us=us, roofline_frac=frac)
                print(f"K={K} B={B:4d} {name:22s} "
                      + (f"{us:8.1f} us  {frac:5.3f}" if us else "   (cpu)   ")
                      + f"  err {err:.1e}{'  bitwise' if bits else ''}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
