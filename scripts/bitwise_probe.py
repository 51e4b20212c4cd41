"""Where chain and K decodes differ, if anywhere (GPU probe for a bitwise failure).

The H200 gdn_verify run of 2026-11-29 (reports/h200-2026-11-29s3) found the chain's bf16
outputs not bitwise equal to K decodes at one point (kd=vd=64, K=8, B=256; states and snapshots
equal). This counts mismatching elements of o in bf16 and in fp32 outputs (``out_dtype``), for
seven (kd, K, B) cases from kd = 64 to 256 (run it twice: a count that changes between two
identical runs is a race, one that stays is an arithmetic difference), and prints the first
few differing fp32 values (states are compared too, snapshots are not); then the lazy exact carry verify against K decodes (bf16 and fp32 inputs). Usage on a GPU:  python3 scripts/bitwise_probe.py   (~30 s)

The runtime row loop the library now uses for chains longer than 4 rows
(the ``chain_unroll_max_rows`` setting) was tried first through this script's ``--rolled-chain`` option
(commit d450be2; log reports/h200-2026-11-29s3/logs/bitwise-probe-rolled.log).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401
import torch  # noqa: E402

from pmll_lab.gdn import gdn_chain, gdn_decode  # noqa: E402
from pmll_lab.inputs import gdn_inputs  # noqa: E402

def mism(a, b):
    a32 = a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32)
    b32 = b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32)
    return (a32 != b32)


def probe(D, K, B, out_dtype, seed=0):
    x = gdn_inputs(seed, B, 16, 32, D, D, rows=K, dtype=torch.bfloat16)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    idx = x["state_indices"]
    sc = x["state"].clone()
    oc = gdn_chain(sc, *args, state_indices=idx, out_dtype=out_dtype)
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


def carry_only():
    """``--carry-only``: the exact carry against decodes with the runtime row loop above 4 rows
    (``exact_unroll_max_rows = 4``) and fully unrolled (8), and the verify's time under each
    (kd=128, B=64, lazy, empty stash)."""
    from pmll_lab.bench import time_launch
    from pmll_lab.carry import GdnCarry, gdn_carry_verify
    from pmll_lab.ops import settings
    for unroll_max in (4, 8):
        with settings.override(exact_unroll_max_rows=unroll_max):
            for D, K, B in [(64, 8, 64), (64, 8, 256), (128, 8, 64), (64, 5, 64), (64, 4, 64)]:
                for dt in (torch.bfloat16, torch.float32):
                    n, tot, per_t = probe_carry(D, K, B, dt)
                    print(f"unroll<={unroll_max} carry vs decodes kd={D:3d} K={K} B={B:3d} "
                          f"inputs={str(dt)[6:]:8s}: {n}/{tot} differ, per row {per_t}",
                          flush=True)
            for K in (4, 8):
                x = gdn_inputs(0, 64, 16, 32, 128, 128, rows=K)
                args = [x[n] for n in ("q", "k", "v", "g", "beta")]
                carry = GdnCarry.empty(64, 32, 128, 128, device=x["state"].device)
                t = time_launch(lambda: gdn_carry_verify(x["state"], carry, *args,
                                                         slot_tab=x["state_indices"], lazy=True))
                print(f"unroll<={unroll_max} carry exact lazy kd=128 K={K} B=64 pend=0: "
                      f"{t['median_us']:.1f} us", flush=True)


def probe_carry(D, K, B, dtype, seed=0):
    """Lazy exact carry verify (empty stash) against K decodes: differing output elements."""
    from pmll_lab.carry import GdnCarry, gdn_carry_verify
    x = gdn_inputs(seed, B, 16, 32, D, D, rows=K, dtype=dtype)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    idx = x["state_indices"]
    carry = GdnCarry.empty(B, 32, D, D, device=x["state"].device)
    oc, _ = gdn_carry_verify(x["state"].clone(), carry, *args, slot_tab=idx, form="exact",
                             lazy=True)
    sd = x["state"].clone()
    od = torch.stack([gdn_decode(sd, *[a[:, t] for a in args], state_indices=idx)
                      for t in range(K)], 1)
    m = mism(oc, od)
    return int(m.sum()), m.numel(), m.sum(dim=(0, 2, 3)).tolist()


def main():
    if "--carry-only" in sys.argv:
        return carry_only()
    print(f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
    for D, K, B in [(64, 4, 64), (64, 8, 64), (64, 8, 256), (128, 4, 64), (128, 8, 64),
                    (128, 8, 256), (256, 8, 64)]:
        for od in (torch.bfloat16, torch.float32):
            for rep in range(1):
                n, tot, s_same, per_t, vals = probe(D, K, B, od)
                print(f"kd={D:3d} K={K} B={B:3d} o={str(od)[6:]:8s} run{rep}: "
                      f"{n}/{tot} o elements differ, state same={s_same}, per row {per_t}"
                      + (f" e.g. {vals[:2]}" if vals else ""), flush=True)
    for D, K, B in [(64, 4, 64), (64, 8, 64), (64, 8, 256), (128, 8, 64), (256, 8, 64)]:
        for dt in (torch.bfloat16, torch.float32):
            n, tot, per_t = probe_carry(D, K, B, dt)
            print(f"carry exact lazy vs decodes kd={D:3d} K={K} B={B:3d} inputs={str(dt)[6:]:8s}: "
                  f"{n}/{tot} o elements differ, per row {per_t}", flush=True)
    if torch.cuda.is_available():
        from pmll_lab.bench import time_launch
        for D, K in ((128, 4), (128, 8), (64, 8)):
            x = gdn_inputs(0, 64, 16, 32, D, D, rows=K, dtype=torch.bfloat16)
            args = [x[n] for n in ("q", "k", "v", "g", "beta")]
            inter = torch.empty(64, K - 1, 32, D, D, device=x["state"].device)
            t = time_launch(lambda: gdn_chain(x["state"], *args, state_indices=x["state_indices"],
                                              intermediate=inter))["median_us"]
            print(f"chain+snapshots kd={D} K={K} B=64: {t:.1f} us", flush=True)


if __name__ == "__main__":
    main()
