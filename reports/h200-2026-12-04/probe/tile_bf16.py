"""The probe behind logs/tile-bf16.log and tile-bf16-2.log (a record of what ran, not a tool):
V-major decode (K=1) and the K=4 chain with snapshots on a bf16 state, each tile of BR value
rows per program forced for every batch through settings.override, checked against
float64 and timed by roofline.gdn_point. Run from the project root on a GPU:
    python3 reports/h200-2026-12-04/probe/tile_bf16.py 64,256 8,16,32,4     (tile-bf16.log)
    python3 reports/h200-2026-12-04/probe/tile_bf16.py 1,8,128 8,16         (tile-bf16-2.log)
"""
import sys
import time

import pmll_lab  # noqa: F401  (first: picks the device)
from pmll_lab.experiments import roofline as R
from pmll_lab.ops import settings

t0 = time.time()
batches = [int(x) for x in sys.argv[1].split(",")]
tiles = [int(x) for x in sys.argv[2].split(",")]
shape = dict(B=batches, head_dim=[128], heads=[(16, 32)], dtype=["bfloat16"],
             state_layout=["vk"], state_dtype=["bfloat16"])
pts = R.points([dict(K=[1], providers=["decodes"], **shape),
                dict(K=[4], providers=["chain_snapshots"], **shape)], fla=False)
for br in tiles:
    # at db3641c (the logged runs) vk_tiles alone set these rows; since, vk_rows_half does
    with settings.override(vk_tiles=((1 << 62, br, 16, 1),), vk_rows_half=((1 << 62, br),)):
        for p in pts:
            try:
                rows = R.gdn_point(p)
            except Exception as exc:
                print(br, p["provider"], p["B"], "FAILED", exc, flush=True)
                continue
            ok = all(r.get("passed", True) for r in rows if r.get("metric") != "time_us")
            for r in rows:
                if r.get("metric") == "time_us" and r.get("timer") == "cuda_graph":
                    print(f"BR={br:3d} {p['provider']:16s} B={p['B']:4d} {r['value']:8.1f} us "
                          f"checks_ok={ok}  t={time.time() - t0:.0f}s", flush=True)
