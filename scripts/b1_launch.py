"""B=1 launch paths side by side (issue 5's <= 10 us per call target; perf-notes v9).

For decode (K=1) and the lazy exact carry verify (K=4, 3 pending rows), HV=32, HK=16,
kd=vd=128, bf16 inputs: the plain launcher, its launch plan (``gdn_decode_plan``,
``gdn_carry_verify_plan``: arguments checked and bound once, later calls straight to the compiled
kernel) and Triton's bare ``kernel[grid](...)`` with the same arguments (no checks of ours), each
as ``do_bench`` times it (median, host launch included), as a CUDA graph replay, and as host
microseconds per call (host clock over 3000 queued calls); the plan's results are first checked
bitwise against the launcher's on its second (direct) call. (The host column was
``scripts/plan_host_time.py`` until it was folded in here.)

Usage on a GPU:  python3 scripts/b1_launch.py      (~20 s)
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401  (first: GPU or the Triton interpreter)
import torch  # noqa: E402

from pmll_lab.backend import DEVICE, device_name  # noqa: E402
from pmll_lab.bench import bitwise_equal, time_graph, time_launch  # noqa: E402
from pmll_lab.carry import GdnCarry, gdn_carry_verify, gdn_carry_verify_plan  # noqa: E402
from pmll_lab.gdn import gdn_decode, gdn_decode_plan  # noqa: E402
from pmll_lab.inputs import gdn_inputs  # noqa: E402

ROWS = ("q", "k", "v", "g", "beta")


def host_us(fn, calls=3000):
    """Host microseconds per call, GPU work left queued (drained before and after)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def report(name, fn):
    t = time_launch(fn, warmup_ms=25, rep_ms=200)
    g = time_graph(fn)
    print(f"{name:34s} do_bench median {t['median_us']:7.1f} us (p20 {t['p20_us']:6.1f}, "
          f"p80 {t['p80_us']:6.1f})   graph replay {g if g is None else round(g, 2)} us   "
          f"host {host_us(fn):6.1f} us/call", flush=True)


def main():
    print(f"device {device_name()}", flush=True)
    HK, HV, D = 16, 32, 128
    x = gdn_inputs(0, 1, HK, HV, D, D, slots=1)
    row = [x[n] for n in ROWS]
    st_a, st_b = x["state"].clone(), x["state"].clone()
    plan = gdn_decode_plan(st_b, *row, state_indices=x["state_indices"])
    for _ in range(2):
        st_b.copy_(x["state"])
        o_b = plan().clone()
        print(f"decode plan: direct path from the next call: {plan.direct}", flush=True)
    o_a = gdn_decode(st_a, *row, state_indices=x["state_indices"])
    print(f"decode plan bitwise: {bitwise_equal(o_a, o_b) and bitwise_equal(st_a, st_b)}")
    report("decode K=1 B=1 launcher", lambda: gdn_decode(st_a, *row,
                                                         state_indices=x["state_indices"]))
    report("decode K=1 B=1 plan", plan)
    bare = plan.kernel[plan.grid]
    report("decode K=1 B=1 bare triton launch", lambda: bare(*plan.args, **plan.kwargs))

    xr = gdn_inputs(1, 1, HK, HV, D, D, rows=4, slots=1)
    rows = [xr[n] for n in ROWS]
    carry0 = GdnCarry.empty(1, HV, D, D, device=DEVICE)
    gen = torch.Generator().manual_seed(2)
    carry0.buf.copy_(torch.randn(carry0.buf.shape, generator=gen).mul_(0.1))
    carry0.g.copy_(-torch.rand(carry0.g.shape, generator=gen))
    k = torch.randn(carry0.k.shape, generator=gen)
    carry0.k.copy_(k / k.norm(dim=-1, keepdim=True))
    carry0.pend.fill_(3)
    ca, cb = GdnCarry.empty(1, HV, D, D, device=DEVICE), GdnCarry.empty(1, HV, D, D, device=DEVICE)
    for c in (ca, cb):
        c.buf.copy_(carry0.buf)
        c.pend.copy_(carry0.pend)
    sa, sb = xr["state"].clone(), xr["state"].clone()
    vplan = gdn_carry_verify_plan(sb, cb, *rows, slot_tab=xr["state_indices"], form="exact",
                                  lazy=True)
    for _ in range(2):
        cb.buf.copy_(carry0.buf)
        ob, eb = (t.clone() for t in vplan())
        print(f"carry plan: direct path from the next call: {vplan.direct}", flush=True)
    oa, ea = gdn_carry_verify(sa, ca, *rows, slot_tab=xr["state_indices"], form="exact",
                              lazy=True)
    same = all(bitwise_equal(a, b) for a, b in ((oa, ob), (ea, eb), (sa, sb), (ca.buf, cb.buf)))
    print(f"carry plan bitwise: {same}")
    report("carry lazy K=4 p=3 B=1 launcher",
           lambda: gdn_carry_verify(sa, ca, *rows, slot_tab=xr["state_indices"], form="exact",
                                    lazy=True))
    report("carry lazy K=4 p=3 B=1 plan", vplan)
    vbare = vplan.kernel[vplan.grid]
    report("carry lazy K=4 p=3 B=1 bare triton", lambda: vbare(*vplan.args, **vplan.kwargs))


if __name__ == "__main__":
    main()
