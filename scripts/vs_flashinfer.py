"""Ours against FlashInfer on the GDN kernels' target rows, in one process (a quick check
between report runs): the roofline notebook's own point function (``roofline.gdn_point``:
checked, then timed by do_bench and CUDA-graph replay) for decode (K=1), the K=4 chain with
snapshots, the lazy exact carry (amortised and its no-write-back row) on V-major states, and
FlashInfer's decode, ``mtp`` with its snapshot buffer and ``mtp`` frozen, at HK=16, HV=32,
kd=vd=128, bf16 inputs, fp32 and/or bf16 state pools (``--states``); ``--cuda`` adds the CUDA
C++ twins of decode and chain (``decodes_cuda``, ``chain_snapshots_cuda``). Prints graph-replay
medians (µs), fractions of the copy roofline and ratios against FlashInfer (and CUDA against
Triton);
``--out`` keeps every row as JSON lines. Usage on a GPU with FlashInfer importable:
``python3 scripts/vs_flashinfer.py [--B 64,128,256] [--states float32,bfloat16] [--cuda]
[--out rows.jsonl]``
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401  (first: GPU or the Triton interpreter)

from pmll_lab import peers  # noqa: E402
from pmll_lab.results import provenance  # noqa: E402
from pmll_lab.experiments import protocol as P  # noqa: E402
from pmll_lab.experiments import roofline as R  # noqa: E402
from pmll_lab.harness import verify as V  # noqa: E402


def _widths(text: str) -> list[int]:
    """``--B``: comma-separated batch widths, each an int >= 1."""
    try:
        Bs = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not Bs or min(Bs) < 1:
        raise argparse.ArgumentTypeError(f"every batch width must be >= 1, got {text!r}")
    return sorted(set(Bs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=_widths, default="64,128,256",
                    help="batch widths, comma separated (default 64,128,256)")
    ap.add_argument("--states", default="float32",
                    help="state pool dtypes, comma separated (default float32)")
    ap.add_argument("--cuda", action="store_true", help="also the CUDA twins of decode and chain")
    ap.add_argument("--out", default=None, help="JSON-lines file for every row (appended)")
    a = ap.parse_args()
    Bs = a.B
    states = list(dict.fromkeys(a.states.split(",")))
    unknown = sorted(set(states) - set(R.STATE_DTYPES))
    if unknown:
        ap.error(f"--states: {unknown} not in {list(R.STATE_DTYPES)}")
    if a.out and not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
        ap.error(f"--out: no folder {os.path.dirname(os.path.abspath(a.out))!r}")
    if not P.on_cuda():
        ap.error("needs a CUDA GPU: it times GPU kernels against FlashInfer's (the notebooks "
                 "run on the CPU under the Triton interpreter, this script does not)")
    if peers.flashinfer_gdn() is None:
        ap.error("FlashInfer is not importable here (flashinfer-python 0.7.2, the 'peers' extra)")
    shape = dict(B=Bs, head_dim=[128], heads=[(16, 32)], dtype=["bfloat16"], state_layout=["vk"],
                 state_dtype=states)
    twins = ([V.DECODES_CUDA.name], [V.CHAIN_CUDA.name]) if a.cuda else ([], [])
    pts = R.points([dict(K=[1], providers=[V.DECODES.name, *twins[0], V.FLASHINFER_DECODE.name],
                         **shape),
                    dict(K=[4], providers=[V.CHAIN.name, *twins[1], V.CARRY_LAZY.name,
                                           V.MTP_SNAPSHOTS.name, V.MTP_FROZEN.name],
                         **shape)], fla=False)
    out = open(a.out, "a") if a.out else None
    env = provenance()              # device, versions, commit, kernel switches on every row
    t, frac = {}, {}
    for p in pts:
        try:
            rows = R.gdn_point(p)
        except Exception as exc:                      # one point's failure loses no other
            sd = p.get("state_dtype", "float32")
            print(f"{p['provider']} K={p['K']} B={p['B']} {sd}: FAILED {type(exc).__name__}: {exc}",
                  flush=True)
            continue
        sd = p.get("state_dtype", "float32")
        here = set()
        for r in rows:
            if out:
                out.write(json.dumps({**p, **r, "state_dtype": sd, **env}, default=str) + "\n")
            key = (r.get("kernel", "").split(" [")[0], p["K"], p["B"], sd)
            if r.get("metric") == "roofline_frac" and r.get("timer") == "cuda_graph":
                frac[key] = r["value"]
            if r.get("metric") == "time_us" and r.get("timer") == "cuda_graph":
                t[key] = r["value"]
                here.add(key)
        for key in sorted(here):
            f = f"  ({frac[key]:.2f} of copy)" if key in frac else ""
            print(f"{key[0]:28s} {sd:9s} K={p['K']} B={p['B']:4d} {t[key]:8.1f} us{f}",
                  flush=True)
    if out:
        out.close()
    pairs = [(V.DECODES.name, V.FLASHINFER_DECODE.name, 1),
             (V.CHAIN.name, V.MTP_SNAPSHOTS.name, 4),
             (V.DECODES_CUDA.name, V.FLASHINFER_DECODE.name, 1),
             (V.CHAIN_CUDA.name, V.MTP_SNAPSHOTS.name, 4),
             (V.DECODES_CUDA.name, V.DECODES.name, 1), (V.CHAIN_CUDA.name, V.CHAIN.name, 4),
             (V.CARRY_LAZY.name, V.MTP_SNAPSHOTS.name, 4),
             (f"{V.CARRY_LAZY.name}:nowb", V.MTP_FROZEN.name, 4)]
    for sd in states:
        for ours, fi, K in pairs:
            for B in Bs:
                x, y = t.get((ours, K, B, sd)), t.get((fi, K, B, sd))
                if x and y:
                    print(f"ratio {sd} state {ours} / {fi} K={K} B={B}: {x:.1f} / {y:.1f} "
                          f"= {x / y:.3f}")


if __name__ == "__main__":
    main()
