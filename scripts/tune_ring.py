"""Tune and check the ring form's kernels on a GPU (SPEC §3d; pmll_lab.ops.carry.gdn_ring).

Qwen3-Next's GDN shape (HK=16, HV=32, kd=vd=128), bf16 inputs, K draft rows, ring length R.
For each state dtype, batch and ring fill ``P`` (``P + K > R`` folds): first a check of the
outputs against the float64 ring reference on the first sequences, then graph-replay times
(L2 flushed, ``pmll_lab.bench.time_cuda_graph``) of the verify for every variant: ``--fused``
tiles of the one-launch verify (``BVxBKxWARPSxSTAGES``; ``split`` = the two-launch form with
each of ``--tiles``). Prints one table; ``--json PATH`` writes the rows.

    python3 scripts/tune_ring.py --batch 64 128 --fused 128x32x4x4 64x32x4x4 split
"""

from __future__ import annotations

import argparse
import json

import torch

import pmll_lab  # noqa: F401  (first)
from pmll_lab.bench import errors, time_cuda_graph
from pmll_lab.carry import GdnRing, gdn_ring_verify, ring_accept
from pmll_lab.experiments.gdn import gating_inputs
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.carry import gdn_ring
from pmll_lab.reference import ring as ref_ring
from pmll_lab.step_bench import fill_ring

HK, HV, KD, VD = 16, 32, 128, 128


SPLIT = ((1 << 62, 0, 0, 0, 0),)


def point(B, K, R, fill, state_dtype, tiles, precisions, preps=((None, None),), ref_seqs=4,
          fused=(None,)):
    x = gdn_inputs(B, B, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16)
    gate = gating_inputs(B + 1, (B, K), HV)
    state = x["state"].transpose(-1, -2).contiguous().to(state_dtype)
    ring = GdnRing.empty(B, HK, HV, KD, VD, length=R, dtype=state_dtype)
    fill_ring(ring, fill, seed=B)
    slots = x["state_indices"]
    kw = dict(slot_tab=slots, A_log=gate["A_log"], a=gate["a"], dt_bias=gate["dt_bias"],
              b=gate["b"])
    rows = []
    combos = [(prec, tile, prep, None) for prec in (precisions if state_dtype == torch.float32
                                                    else ["-"])
              for tile in tiles for prep in preps] if None in fused else []
    combos += [("-", f, ((None, None)), f) for f in fused if f is not None]
    for prec, tile, (pw, pk), fz in combos:
        knobs = dict(ring_form_tiles=(tile,), ring_form_fused=SPLIT)
        if fz is not None:
            knobs = dict(ring_form_fused=((1 << 62,) + fz,))
        if pw is not None:
            knobs.update(ring_form_prep_warps=pw, ring_form_prep_keys=pk)
        if prec != "-":
            gdn_ring.RING_PRECISION = prec          # arithmetic, not a launch setting
        with settings.override(**knobs):
            st, rg = state.clone(), GdnRing(ring.k.clone(), ring.u.clone(), ring.G.clone(),
                                             ring.len.clone(), ring.base.clone(), R)
            o, e = gdn_ring_verify(st, rg, x["q"], x["k"], x["v"], **kw)
            # check: the first ref_seqs sequences against the float64 ring reference
            sl = slots[:ref_seqs].cpu().long()
            kv = state.double().transpose(-1, -2).cpu()
            rr = ref_ring.RefRing.from_ring(ring)
            g, beta = gate["g"][:ref_seqs].cpu(), gate["beta"][:ref_seqs].cpu()
            o_ref, e_ref = ref_ring.verify(kv, rr, x["q"][:ref_seqs].cpu(), x["k"][:ref_seqs].cpu(),
                                           x["v"][:ref_seqs].cpu(), g, beta, sl,
                                           state_dtype=state_dtype, ring_dtype=state_dtype)
            err = errors(o[:ref_seqs].float(), o_ref)["rel_l2"]
            ok = e[:ref_seqs].cpu().tolist() == e_ref.tolist()
            st2, rg2 = state.clone(), GdnRing(ring.k.clone(), ring.u.clone(), ring.G.clone(),
                                               ring.len.clone(), ring.base.clone(), R)
            verify = lambda: gdn_ring_verify(st2, rg2, x["q"], x["k"], x["v"], **kw)  # noqa: E731
            t = time_cuda_graph(verify) or dict(median_us=float("nan"), p20_us=0, p80_us=0)
            acc = torch.full((B,), K - 1, dtype=torch.int32, device=slots.device)
            eng = torch.ones(B, dtype=torch.int32, device=slots.device)
            ta = time_cuda_graph(lambda: ring_accept(rg2, slots, eng, acc)) or t
            label = ("fused " + "x".join(map(str, fz)) if fz is not None else
                     "split " + "x".join(map(str, tile)) + ("" if pw is None else f"/p{pw}x{pk}"))
            rows.append(dict(B=B, K=K, R=R, fill=fill, state=str(state_dtype).split(".")[1],
                             tile=label, precision=prec, rel_l2=err, engaged_ok=ok,
                             verify_us=t["median_us"], p20=t["p20_us"], p80=t["p80_us"],
                             accept_us=ta["median_us"]))
            print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 128])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--fill", type=int, nargs="+", default=[4, 13])
    ap.add_argument("--state", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--tiles", nargs="+", default=["64x32x4x3"],
                    help="state-kernel tiles of the two-launch form, BVxBKxWARPSxSTAGES")
    ap.add_argument("--fused", nargs="+", default=["128x32x4x4", "split"],
                    help="one-launch tiles BVxBKxWARPSxSTAGES, or 'split' (the two-launch form)")
    ap.add_argument("--precision", nargs="+", default=["tf32x3"])
    ap.add_argument("--prep", nargs="+", default=[], help="per-head kernel WARPSxKEYS")
    ap.add_argument("--pdl", type=int, nargs="+", default=[1],
                    help="programmatic dependent launch of the state kernel: 1 on, 0 off")
    ap.add_argument("--kernels", nargs="+", default=[None],
                    help="files defining a variant gdn_ring_fused_kernel to time in place of "
                         "the library's (one-launch variants only); 'lib' = the library's")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for kfile in args.kernels:
        _use_kernel(kfile)
        rows += [dict(r, tile=r["tile"] + ("" if kfile in (None, "lib") else
                                           "/" + kfile.rsplit("/", 1)[-1].removesuffix(".py")))
                 for r in sweep(args, [f for f in args.fused
                                       if kfile in (None, "lib") or f != "split"])]
    _report(rows, args.json)


def _use_kernel(path):
    """Put the variant's gdn_ring_fused_kernel (or the library's, ``None``/``lib``) in place."""
    import importlib.util

    from pmll_lab.ops.carry import gdn_ring_fused
    kernel = gdn_ring_fused.gdn_ring_fused_kernel
    if path not in (None, "lib"):
        spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(path))}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        kernel = mod.gdn_ring_fused_kernel
    gdn_ring.gdn_ring_fused_kernel = kernel


def sweep(args, fused):
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles]
    rows = []
    for pdl in args.pdl:
      for sd in args.state:
        for B in args.batch:
            for fill in args.fill:
                with settings.override(ring_form_pdl=bool(pdl)):
                    new = point(B, args.rows, args.length, fill, getattr(torch, sd), tiles,
                                args.precision,
                                [tuple(int(v) for v in x.split("x")) for x in args.prep]
                                or ((None, None),),
                                fused=[None if f == "split" else tuple(int(v) for v in f.split("x"))
                                       for f in fused])
                rows += [dict(r, tile=r["tile"] + (f"/pdl{pdl}" if "split" in r["tile"] else ""))
                         for r in new]
    return rows


def _report(rows, json_path):
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'state':9} {'B':>4} {'fill':>4} {'variant':>26} {'prec':>7} {'verify us':>10} "
          f"{'accept us':>9} {'rel_l2':>9}")
    for r in rows:
        print(f"{r['state']:9} {r['B']:4d} {r['fill']:4d} {r['tile']:>26} {r['precision']:>7} "
              f"{r['verify_us']:10.1f} {r['accept_us']:9.1f} {r['rel_l2']:9.1e}"
              f"{'' if r['engaged_ok'] else '  ENGAGED MISMATCH'}")


if __name__ == "__main__":
    main()
