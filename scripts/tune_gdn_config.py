"""GPU sweep of the GDN family's launch config on the real kernels (issue 5, perf-notes v7).

Every GDN kernel that must agree bitwise with decode (decode, the chain, the exact carry verify
and its fold) launches with ``block_config``; this script runs each candidate ``(BV, warps)``
(the ``kv_block`` setting of ``pmll_lab.ops.settings``) with the row prefetch on and off
(``carry_prefetch_rows``; decode and the chain had their own switch, measured
slower with it and removed since: perf-notes v7), and for each:

1. checks the family still agrees to the bit under it: two lazy exact carry verifies (the second
   folds 3 stashed rows, a third writes back after 7) against plain ``gdn_decode`` of the same
   rows (outputs and the written-back state), B=8, bf16 inputs;
2. times (do_bench median, µs, and fraction of the copy roofline over SPEC §4 bytes) decode K=1
   at B=1/64/128, the K=4 chain with snapshots at B=64, and the lazy exact carry verify K=4 with
   3 pending rows (no write-back) and 5 (write-back) at B=1/64/128; CUDA graph replay at B=1.

HV=32, HK=16, kd=vd=128, fp32 state. Usage on the H200:  python3 scripts/tune_gdn_config.py
(~3-4 minutes); ``--configs 32x1,16x1`` picks configs; ``--smoke`` runs the check only, at tiny
sizes, on the CPU interpreter.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401  (first: GPU or the Triton interpreter)
import torch  # noqa: E402

from pmll_lab.backend import DEVICE, device_name  # noqa: E402
from pmll_lab.bench import bitwise_equal, copy_bandwidth, time_graph, time_launch  # noqa: E402
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_verify  # noqa: E402
from pmll_lab.gdn import (chain_bytes, decode_bytes, gdn_chain, gdn_decode, row_io_bytes,  # noqa: E402
                          state_bytes)
from pmll_lab.inputs import gdn_inputs  # noqa: E402
from pmll_lab.ops import settings  # noqa: E402
from tune_carry import case as carry_case, nbytes as carry_bytes  # noqa: E402  (scripts/)

CONFIGS = ["32x1", "16x1", "8x1", "16x2", "32x2", "32x4", "64x4"]


def rows_of(x, t0, t1):
    return [x[n][:, t0:t1] for n in ("q", "k", "v", "g", "beta")]


def check_family(HK, HV, D, B=8, seed=7):
    """Three lazy exact verifies (K=4; accepted 3, then 4, the third writes back) against plain
    decoding of the accepted rows, bitwise. Returns a list of what differed (empty: agreed)."""
    K, bad = 4, []
    xs = [gdn_inputs(seed + i, B, HK, HV, D, D, rows=K, slots=B + 2) for i in range(3)]
    slots = xs[0]["state_indices"]
    state = xs[0]["state"].clone()
    plain = state.clone()
    carry = GdnCarry.empty(B + 2, HV, D, D, device=DEVICE)
    for i, (x, acc) in enumerate(zip(xs, (3, 4, 1))):
        o, engaged = gdn_carry_verify(state, carry, *rows_of(x, 0, K), slot_tab=slots,
                                      form="exact", lazy=True)
        snap = plain.clone()
        outs = []
        for t in range(K):
            outs.append(gdn_decode(snap, *[r[:, t] for r in rows_of(x, 0, K)], state_indices=slots))
        if not bitwise_equal(o, torch.stack(outs, 1)):
            bad.append(f"verify {i} outputs")
        if i == 2 and not (bool((engaged == 2).all()) and bitwise_equal(state[slots.long()],
                                                                        plain[slots.long()])):
            bad.append("verify 2 written-back state")
        for t in range(acc):   # plain decoding keeps the accepted rows
            gdn_decode(plain, *[r[:, t] for r in rows_of(x, 0, K)], state_indices=slots)
        carry_accept(carry, slots, engaged, [acc] * B)
    return bad


def timings(HK, HV, D, roof):
    out = []

    def rec(name, B, fn, nbytes, graph=False):
        t = time_launch(fn, warmup_ms=10, rep_ms=50)["median_us"]
        gr = time_graph(fn) if graph else None
        frac = nbytes / (t * 1e-6) / 1e9 / roof
        out.append(f"{name:18s} B={B:3d} {t:8.1f} us {frac:6.1%}"
                   + (f"  graph {gr:6.1f} us" if gr is not None else ""))

    for B in (1, 64, 128):
        x = gdn_inputs(0, B, HK, HV, D, D, slots=B)
        r = [x[n] for n in ("q", "k", "v", "g", "beta")]
        rec("decode K=1", B, lambda: gdn_decode(x["state"], *r, state_indices=x["state_indices"]),
            decode_bytes(B, HK, HV, D, D), graph=B == 1)
    B = 64
    x = gdn_inputs(0, B, HK, HV, D, D, rows=4, slots=B)
    inter = torch.empty(B, 3, HV, D, D, device=DEVICE)
    rec("chain+snap K=4", B, lambda: gdn_chain(x["state"], *rows_of(x, 0, 4),
                                                state_indices=x["state_indices"],
                                                intermediate=inter),
        chain_bytes(B, 4, HK, HV, D, D))
    for B in (1, 64, 128):
        for pend in (3, 5):
            x, carry = carry_case(B, 4, HK, HV, D, pend)
            rec(f"carry lazy p={pend}", B,
                lambda: gdn_carry_verify(x["state"], carry, *rows_of(x, 0, 4),
                                         slot_tab=x["state_indices"], form="exact", lazy=True),
                carry_bytes(B, 4, HK, HV, D, pend, pend + 4 > 8), graph=B == 1)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=",".join(CONFIGS), help="BVxWARPS list")
    ap.add_argument("--smoke", action="store_true", help="check only, tiny sizes (CPU)")
    a = ap.parse_args()
    HK, HV, D = (1, 2, 32) if a.smoke else (16, 32, 128)
    roof = None if a.smoke else copy_bandwidth()
    print(f"device {device_name()}; copy roofline {roof and round(roof)} GB/s", flush=True)
    for cfg in a.configs.split(","):
        bv, w = (int(s) for s in cfg.split("x"))
        for prefetch in (True, False):
            with settings.override(kv_block=(bv, w), carry_prefetch_rows=prefetch):
                head = f"== BV={bv} warps={w} prefetch={int(prefetch)}"
                try:
                    bad = check_family(HK, HV, D)
                    print(f"{head}: family bitwise {'OK' if not bad else 'DIFFERS: ' + ', '.join(bad)}",
                          flush=True)
                    if not a.smoke and not bad:
                        for line in timings(HK, HV, D, roof):
                            print(f"   {line}", flush=True)
                except Exception as e:  # noqa: BLE001  (a failed config must not end the sweep)
                    print(f"{head}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
