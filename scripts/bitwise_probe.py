"""Where chain and K decodes differ, if anywhere (GPU probe for a bitwise failure).

The H200 gdn_verify run of 2026-11-29 (reports/h200-2026-11-29s3) found the chain's bf16
outputs not bitwise equal to K decodes at one point (kd=vd=64, K=8, B=256; states and snapshots
equal). This counts mismatching elements of o in bf16 and in fp32 outputs (``out_dtype``), for
kd 64 / 128, K 4 / 8, B 64 / 256, twice each (a count that changes between two identical runs
is a race, one that stays is an arithmetic difference), and prints the first few differing fp32
values. Usage on a GPU:  python3 scripts/bitwise_probe.py   (~30 s)

``--rolled-chain``: the chain from a copy of ``pmll_lab/ops/gdn/decode.py`` whose row loop is a
runtime ``range(K)`` instead of ``tl.static_range(K)`` (one compiled loop body for every row),
against the library's decode: a test of that fix before it goes into the library.
"""

import argparse
import importlib.util
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401
import torch  # noqa: E402

from pmll_lab.gdn import gdn_chain, gdn_decode  # noqa: E402
from pmll_lab.inputs import gdn_inputs  # noqa: E402

CHAIN = gdn_chain


def rolled_chain():
    """``gdn_chain`` from a copy of decode.py with a runtime row loop in ``gdn_rows_kernel``."""
    import pmll_lab.ops.gdn.decode as D
    src = open(D.__file__).read()
    old = "    for t in tl.static_range(K):\n        if PREFETCH:"
    assert src.count(old) == 1, "decode.py changed: update the probe"
    src = src.replace(old, "    for t in range(K):\n        if PREFETCH:")
    path = os.path.join(tempfile.mkdtemp(), "decode_rolled.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("decode_rolled", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.gdn_chain


def mism(a, b):
    a32 = a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32)
    b32 = b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32)
    return (a32 != b32)


def probe(D, K, B, out_dtype, seed=0):
    x = gdn_inputs(seed, B, 16, 32, D, D, rows=K, dtype=torch.bfloat16)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    idx = x["state_indices"]
    sc = x["state"].clone()
    oc = CHAIN(sc, *args, state_indices=idx, out_dtype=out_dtype)
    sd = x["state"].clone()
    od = torch.stack([gdn_decode(sd, *[a[:, t] for a in args], state_indices=idx,
                                 out_dtype=out_dtype) for t in range(K)], 1)
    m = mism(oc, od)
    n = int(m.sum())
    s_same = bool((sc.view(torch.int32) == sd.view(torch.int32)).all())
    where = m.nonzero()[:4].tolist()
    vals = [(w, float(oc[tuple(w)]), float(od[tuple(w)])) for w in where]
    per_t = m.sum(dim=(0, 2, 3)).tolist()
    return n, m.numel(), s_same, per_t, vals


def main():
    global CHAIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--rolled-chain", action="store_true")
    if ap.parse_args().rolled_chain:
        CHAIN = rolled_chain()
        print("chain: runtime row loop (copy of decode.py)")
    print(f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
    for D, K, B in [(64, 4, 64), (64, 8, 64), (64, 8, 256), (128, 4, 64), (128, 8, 64),
                    (128, 8, 256), (256, 8, 64)]:
        for od in (torch.bfloat16, torch.float32):
            for rep in range(1):
                n, tot, s_same, per_t, vals = probe(D, K, B, od)
                print(f"kd={D:3d} K={K} B={B:3d} o={str(od)[6:]:8s} run{rep}: "
                      f"{n}/{tot} o elements differ, state same={s_same}, per row {per_t}"
                      + (f" e.g. {vals[:2]}" if vals else ""), flush=True)
    if torch.cuda.is_available():
        from pmll_lab.bench import time_launch
        for D, K in ((128, 4), (128, 8), (64, 8)):
            x = gdn_inputs(0, 64, 16, 32, D, D, rows=K, dtype=torch.bfloat16)
            args = [x[n] for n in ("q", "k", "v", "g", "beta")]
            inter = torch.empty(64, K - 1, 32, D, D, device=x["state"].device)
            for name, fn in (("library chain", gdn_chain), ("probed chain", CHAIN)):
                t = time_launch(lambda: fn(x["state"], *args, state_indices=x["state_indices"],
                                           intermediate=inter))["median_us"]
                print(f"chain+snapshots kd={D} K={K} B=64 {name}: {t:.1f} us", flush=True)


if __name__ == "__main__":
    main()
