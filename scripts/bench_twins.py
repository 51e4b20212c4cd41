"""The GDN decode and chain: Triton kernels against their CUDA C++ twins, one process, one GPU.

Qwen3-Next's GDN shape (HK=16, HV=32, kd=vd=128), bf16 inputs, V-major state in fp32 and bf16,
B in 1, 8, 64, 128, 256: ``gdn_decode`` (K=1) and ``gdn_chain`` with K-1 snapshots (K=4). Each
pair is checked first (the twin's outputs and final state against the Triton kernel's, rel L2
within the decode's tolerances, both held to float64 by the tests), then timed by CUDA-graph
replay and do_bench (``protocol.timings``); GB/s and the copy-roofline fraction by SPEC §4's byte
counts. Prints one table (µs, roofline fraction, twin / Triton) and writes the rows as JSON lines
to ``--out``. ``--build TAG=NAME=VALUE[,NAME=VALUE]`` (repeatable) also times a variant build of
the twins (``cuda_ext.load(defines=...)``: the knobs of ``kernels/gdn_stage.cuh``, e.g.
``w2=PMLL_GDN_WIDE_ROWS=2``) as impl ``cuda[TAG]``, each first checked bitwise against the default
build (the knobs move no sum). Usage (GPU): ``python3 scripts/bench_twins.py [--batches 1,64]
[--build w2=PMLL_GDN_WIDE_ROWS=2] [--out F]``.
"""

from __future__ import annotations

import argparse
import json

import pmll_lab  # noqa: F401  (first: picks the device)
import pandas as pd
import torch

from pmll_lab import cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.bench import cli_gpu, cli_ints, cli_out, errors
from pmll_lab.experiments import protocol as P
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.inputs import gdn_inputs
from pmll_lab.sizes import chain_bytes, decodes_bytes
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL

HK, HV, D = 16, 32, 128


def _variant(mod, K, st, args, sel, snaps):
    """A launch of a variant build's module (the binding itself: the launchers use the default
    build) on ``st`` in place, returning the outputs."""
    q, k, v, g, beta = args
    if K == 1:
        o = torch.empty(v.shape[0], v.shape[2], v.shape[3], dtype=q.dtype, device=DEVICE)
        mod.gdn_decode_vk(st, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], o, D ** -0.5, True,
                          state_indices=sel)
    else:
        o = torch.empty(v.shape, dtype=q.dtype, device=DEVICE)
        mod.gdn_chain_vk(st, q, k, v, g, beta, o, D ** -0.5, True, intermediate=snaps,
                         state_indices=sel)
    return o


def _pair(B: int, K: int, sdt: torch.dtype, builds: dict) -> list[dict]:
    x = gdn_inputs(7 + B, B, HK, HV, D, D, rows=K, dtype=torch.bfloat16, state_layout="kv")
    state0 = x["state"].transpose(-1, -2).contiguous().to(sdt)          # [S, HV, vd, kd]
    sel = x["state_indices"]
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    snaps = torch.empty(B, K - 1, HV, D, D, dtype=sdt, device=DEVICE) if K > 1 else None

    def launch(impl, st):
        if K == 1:
            return gdn_decode(st, *(a[:, 0] for a in args), state_indices=sel,
                              state_layout="vk", impl=impl)
        return gdn_chain(st, *args, state_indices=sel, intermediate=snaps, state_layout="vk",
                         impl=impl)

    outs = {}
    for impl in ("triton", "cuda"):
        st = state0.clone()
        outs[impl] = (launch(impl, st).float(), st[sel.long()].float())
    stol = STATE_TOL if sdt == torch.float32 else HALF_STATE_TOL[str(sdt).split(".")[1]]
    eo = errors(outs["cuda"][0], outs["triton"][0])["rel_l2"]
    es = errors(outs["cuda"][1], outs["triton"][1])["rel_l2"]
    if eo > O_TOL["bfloat16"] or es > stol:
        raise AssertionError(f"B={B} K={K} {sdt}: twin vs Triton rel L2 o {eo:.2e} state {es:.2e}")
    nb = (decodes_bytes if K == 1 else chain_bytes)(B, K, HK, HV, D, D, state_dtype=sdt)
    rows = []
    for impl in ("triton", "cuda"):
        st = state0.clone()
        for r in P.speed_rows(f"{'decode' if K == 1 else 'chain'}", P.timings(
                lambda: launch(impl, st)), nb, variant=""):
            rows.append(dict(r, impl=impl, B=B, K=K, state_dtype=str(sdt).split(".")[1],
                             rel_l2_o_vs_triton=eo))
    for tag, mod in builds.items():
        st = state0.clone()
        o = _variant(mod, K, st, args, sel, snaps)
        if not (torch.equal(o.float(), outs["cuda"][0]) and torch.equal(st[sel.long()].float(),
                                                                          outs["cuda"][1])):
            raise AssertionError(f"B={B} K={K} {sdt}: build {tag} not bitwise the default build")
        st = state0.clone()
        for r in P.speed_rows(f"{'decode' if K == 1 else 'chain'}", P.timings(
                lambda: _variant(mod, K, st, args, sel, snaps)), nb, variant=""):
            rows.append(dict(r, impl=f"cuda[{tag}]", B=B, K=K,
                             state_dtype=str(sdt).split(".")[1], rel_l2_o_vs_triton=float("nan")))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,64,128,256")
    ap.add_argument("--out", default=None, help="JSON lines, one row per measurement")
    ap.add_argument("--build", action="append", default=[], metavar="TAG=NAME=VALUE[,...]",
                    help="also time a variant build of the twins with these definitions")
    a = ap.parse_args(argv)
    specs = {}
    for spec in a.build:
        tag, _, defs = spec.partition("=")
        if not tag.isidentifier() or not defs or tag in specs:
            ap.error(f"--build: expected TAG=NAME=VALUE[,NAME=VALUE] with a new TAG, got {spec!r}")
        try:
            specs[tag] = cuda_ext.check_defines(defs.split(","))
        except ValueError as exc:
            ap.error(f"--build {spec!r}: {exc}")
    batches = cli_ints(ap, "--batches", a.batches)
    cli_out(ap, "--out", a.out)
    cli_gpu(ap, "the CUDA twins")
    builds = {tag: cuda_ext.load("gdn_decode", defines=d) for tag, d in specs.items()}
    rows = []
    if a.out:
        open(a.out, "w").close()
    for sdt in (torch.float32, torch.bfloat16):
        for K in (1, 4):
            for B in batches:
                try:
                    got = _pair(B, K, sdt, builds)
                except Exception as exc:  # noqa: BLE001 - one failed point loses no other
                    print(f"FAILED B={B} K={K} {sdt}: {type(exc).__name__}: {exc}")
                    continue
                rows += got
                if a.out:                        # as measured: a crash later loses none
                    with open(a.out, "a") as f:
                        f.writelines(json.dumps(r, default=str) + "\n" for r in got)
    df = pd.DataFrame(rows)
    if df.empty:
        return 1
    for metric in ("time_us", "roofline_frac"):
        t = df[(df.metric == metric) & (df.timer == "cuda_graph")].pivot_table(
            index=["kernel", "state_dtype", "B"], columns="impl", values="value")
        if metric == "time_us":
            t["cuda/triton"] = t["cuda"] / t["triton"]
        print(f"\n{metric} (CUDA-graph replay)\n{t.round(3).to_string()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
