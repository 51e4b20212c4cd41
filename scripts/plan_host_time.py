"""Host microseconds per call of the B=1 launch paths (launch plan, bare Triton launch, launcher),
timed with the host clock over 3000 calls (GPU work queued; then drained), plus a profile of the
decode plan's call. GPU only.  Usage: python3 scripts/plan_host_time.py   (~10 s)
"""
import os, sys, time, cProfile, pstats
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab, torch
from pmll_lab.backend import DEVICE
from pmll_lab.carry import GdnCarry, gdn_carry_verify_plan
from pmll_lab.gdn import gdn_decode_plan, gdn_decode
from pmll_lab.inputs import gdn_inputs
R = ("q", "k", "v", "g", "beta")
x = gdn_inputs(0, 1, 16, 32, 128, 128, slots=1)
xr = gdn_inputs(1, 1, 16, 32, 128, 128, rows=4, slots=1)
xv = gdn_inputs(0, 1, 16, 32, 128, 128, rows=4, slots=1)
dp = gdn_decode_plan(x["state"], *[x[n] for n in R], state_indices=x["state_indices"])
dpv = gdn_decode_plan(xv["state"], *[xv[n][:, 0] for n in R], state_indices=xv["state_indices"])
c = GdnCarry.empty(1, 32, 128, 128, device=DEVICE)
cp = gdn_carry_verify_plan(xr["state"], c, *[xr[n] for n in R], slot_tab=xr["state_indices"], form="exact", lazy=True)
bare = dp.kernel[dp.grid]
def host(fn, n=3000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    h = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize(); w = (time.perf_counter() - t) / n * 1e6
    return h, w
for name, fn in [("decode plan", dp), ("decode plan on row views", dpv), ("decode bare", lambda: bare(*dp.args, **dp.kwargs)),
                 ("carry plan", cp), ("decode launcher", lambda: gdn_decode(x["state"], *[x[n] for n in R], state_indices=x["state_indices"]))]:
    h, w = host(fn)
    print(f"{name:26s} host {h:6.1f} us/call, with GPU drain {w:6.1f}", flush=True)
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): dp()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(8)
