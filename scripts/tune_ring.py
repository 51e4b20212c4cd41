"""Tune and check the ring form's kernels on a GPU (SPEC §3d; pmll_lab.ops.carry.ring).

Qwen3-Next's GDN shape (HK=16, HV=32, kd=vd=128), bf16 inputs, K draft rows, ring length R.
For each state dtype, batch and ring fill ``P`` (``P + K > R`` folds): first a check of the
outputs against the float64 ring reference on the first sequences, then graph-replay times
(L2 flushed, ``pmll_lab.bench.time_cuda_graph``) of the verify for every tile in ``--tiles``
(``BVxBKxWARPSxSTAGES``); ``--fold-chunk 0 16 32`` repeats each tile with the fold loop's keys
per chunk (``ring_fold_chunk``; 0 = the tile's BK; default the shipped value); ``--kernels FILE ...`` times variant kernels
(a file defining ``gdn_ring_fused_kernel`` with the library's arguments, ``FBK`` included)
beside the library's.
Prints one table; ``--json PATH`` writes the rows.

    python3 scripts/tune_ring.py --batch 64 128 --tiles 128x64x2x2 64x32x1x3 --json $OUT/r.json
"""

from __future__ import annotations

import argparse
import json

import torch

import pmll_lab  # noqa: F401  (first)
from pmll_lab.bench import cli_out, errors, time_cuda_graph, variant_kernel, variant_problem
from pmll_lab.carry import GdnRing, gdn_ring_verify, ring_accept
from pmll_lab.experiments.gdn import gating_inputs
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.carry import ring as ring_form
from pmll_lab.reference import ring as ref_ring
from pmll_lab.harness.step import fill_ring

HK, HV, KD, VD = 16, 32, 128, 128


def point(B, K, R, fill, state_dtype, tiles, ref_seqs=4, fold_chunk=0):
    """Check, then time, the verify (and the commit) at ``fill`` rows for every tile."""
    x = gdn_inputs(B, B, HK, HV, KD, VD, rows=K, dtype=torch.bfloat16, state_layout="kv")
    gate = gating_inputs(B + 1, (B, K), HV)
    state = x["state"].transpose(-1, -2).contiguous().to(state_dtype)
    ring = GdnRing.empty(B, HK, HV, KD, VD, length=R, dtype=state_dtype)
    fill_ring(ring, fill, seed=B)
    slots = x["state_indices"]
    kw = dict(slot_tab=slots, A_log=gate["A_log"], a=gate["a"], dt_bias=gate["dt_bias"],
              b=gate["b"])
    def fresh():
        return state.clone(), GdnRing(ring.k.clone(), ring.u.clone(), ring.G.clone(),
                                      ring.len.clone(), ring.base.clone(), R)
    rows = []
    for tile in tiles:
        size = state.element_size()
        with settings.override(ring_form_tiles=((1 << 62, size) + tile,),
                               ring_fold_chunk=fold_chunk):
            st, rg = fresh()
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
            st2, rg2 = fresh()
            verify = lambda: gdn_ring_verify(st2, rg2, x["q"], x["k"], x["v"], **kw)  # noqa: E731
            t = time_cuda_graph(verify) or dict(median_us=float("nan"), p20_us=0, p80_us=0)
            acc = torch.full((B,), K - 1, dtype=torch.int32, device=slots.device)
            eng = torch.ones(B, dtype=torch.int32, device=slots.device)
            ta = time_cuda_graph(lambda: ring_accept(rg2, slots, eng, acc, rows=K)) or t
            rows.append(dict(B=B, K=K, R=R, fill=fill, state=str(state_dtype).split(".")[1],
                             tile="x".join(map(str, tile)) + (f"/f{fold_chunk}" if fold_chunk
                                                              else ""),
                             rel_l2=err, engaged_ok=ok,
                             verify_us=t["median_us"], p20=t["p20_us"], p80=t["p80_us"],
                             accept_us=ta["median_us"]))
            print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 128],
                    help="sequences B (each >= 1)")
    ap.add_argument("--rows", type=int, default=4, help="draft rows K per verify (2..8, <= R)")
    ap.add_argument("--length", type=int, default=16, choices=(8, 16, 32), help="ring length R")
    ap.add_argument("--fill", type=int, nargs="+", default=[4, 13],
                    help="ring rows P before the verify (0..R; P + K > R folds)")
    ap.add_argument("--state", nargs="+", default=["bfloat16", "float32"],
                    choices=("bfloat16", "float32", "float16"), help="state pool dtypes")
    ap.add_argument("--tiles", nargs="+", default=["64x32x2x4", "64x32x1x3", "128x64x2x2"],
                    help="BVxBKxWARPSxSTAGES (BV, BK powers of two >= 16)")
    ap.add_argument("--kernels", nargs="+", default=["lib"],
                    help="files defining a variant gdn_ring_fused_kernel to time in place of "
                         "the library's; 'lib' = the library's")
    ap.add_argument("--fold-chunk", type=int, nargs="+",
                    default=[settings.ring_form().ring_fold_chunk],
                    help="keys per chunk of the verify's fold loop (ring_fold_chunk; 0 = BK; "
                         "default: the shipped value)")
    ap.add_argument("--json", help="write the rows to this JSON file")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a launch setting to override for every point (pmll_lab.ops.settings), "
                         "repeatable: e.g. ring_coefficients_first=4 (fp32 states too)")
    args = ap.parse_args()
    cli_out(ap, "--json", args.json)
    try:
        over = settings.parse_overrides(args.set)
    except ValueError as exc:
        ap.error(f"--set: {exc}")
    # every argument refused here, before any point is timed
    if any(B < 1 for B in args.batch):
        ap.error(f"--batch: every B must be >= 1, got {args.batch}")
    if not 2 <= args.rows <= min(8, args.length):
        ap.error(f"--rows: K must be in [2, {min(8, args.length)}], got {args.rows}")
    if any(not 0 <= f <= args.length for f in args.fill):
        ap.error(f"--fill: every P must be in [0, {args.length}], got {args.fill}")
    tiles = []
    for t in args.tiles:
        try:
            tile = tuple(int(v) for v in t.split("x"))
            with settings.override(ring_form_tiles=((1 << 62, 4) + tile,)):
                pass
        except ValueError:
            ap.error(f"--tiles: {t!r} is not BVxBKxWARPSxSTAGES with BV, BK powers of two >= 16, "
                     "warps a power of two and stages >= 1")
        tiles.append(tile)
    for kfile in args.kernels:
        problem = variant_problem(ring_form, "gdn_ring_fused_kernel", kfile)
        if problem:                         # loaded once here: a bad file stops the run now
            ap.error(f"--kernels: {problem}")
    for fc in args.fold_chunk:
        try:
            with settings.override(ring_fold_chunk=fc):
                pass
        except ValueError as exc:
            ap.error(f"--fold-chunk: {exc}")
    if not torch.cuda.is_available():
        ap.error("needs a GPU: the H200 shape on the Triton interpreter would take hours")
    rows = []
    for kfile in args.kernels:
        tag = "" if kfile == "lib" else "/" + kfile.rsplit("/", 1)[-1].removesuffix(".py")
        with variant_kernel(ring_form, "gdn_ring_fused_kernel", kfile), \
                settings.override(**over):
            for sd in args.state:
                for B in args.batch:
                    for fill in args.fill:
                        for fc in args.fold_chunk:
                            rows += [dict(r, tile=r["tile"] + tag) for r in
                                     point(B, args.rows, args.length, fill, getattr(torch, sd),
                                           tiles, fold_chunk=fc)]
    _report(rows, args.json)


def _report(rows, json_path):
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'state':9} {'B':>4} {'fill':>4} {'tile':>24} {'verify us':>10} {'accept us':>9} "
          f"{'rel_l2':>9}")
    for r in rows:
        print(f"{r['state']:9} {r['B']:4d} {r['fill']:4d} {r['tile']:>24} {r['verify_us']:10.1f} "
              f"{r['accept_us']:9.1f} {r['rel_l2']:9.1e}"
              f"{'' if r['engaged_ok'] else '  ENGAGED MISMATCH'}")


if __name__ == "__main__":
    main()
