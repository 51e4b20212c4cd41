"""Launch settings of the PMLL kernels on the GPU (SPEC §1), one subcommand per kernel.

``python3 scripts/tune_pmll.py ring``: the ring read and write (``pmll_lab/ops/pmll/ring.py``)
over ``ring_tile_elems`` x ``ring_num_warps`` (``pmll_lab.ops.settings``), do_bench medians on
rings several times the L2 (0.5-1 GB of k + v), GB/s over the fewest bytes each must move
(``pmll_lab.pmll.read_bytes`` / ``write_bytes``) as a fraction of the measured copy bandwidth;
each config first checked against the float64 reference on a slice.

``python3 scripts/tune_pmll.py attention [--quick] [--stages 2,3] [--dtype D] [--shapes
B,H,D;...] [--cells M,T;...]``: the fused ring attention (``pmll_lab/ops/pmll/ring_attention.py``)
over ``BLOCK_M x BLOCK_N x num_warps x num_stages`` by CUDA graph replay (GPU time, L2 flushed),
beside PyTorch SDPA over the same keys laid out contiguously with a lower-right causal bias (the
bound the kernel is held to); each tile first checked against the reference path; one table per
head shape and the best ``attention_tiles`` row. The full grid is 24 tiles x 2 shapes x 5 cells
(several minutes, compiling dominates); ``--quick`` tries 8 chosen tiles. Without a GPU it runs
in the interpreter as a smoke test (wall times, no meaning).

The logs of the runs that chose the shipped values are under ``reports/`` (perf-notes "Launch
constants: PMLL ring and ring attention").
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import pmll_lab  # noqa: F401  (first)

import pandas as pd
import torch
import triton.testing

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import (cli_gpu, cli_ints, copy_bandwidth, errors, run_subcommand,
                            time_cuda_graph, time_launch)
from pmll_lab.experiments.pmll_attention import TOL, sdpa_contiguous, speed_inputs
from pmll_lab.inputs import pmll_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.pmll import ring_attention as ra
from pmll_lab.pmll import RingMemory, memory_attention, pmll_read, pmll_write, read_bytes, write_bytes
from pmll_lab.reference import pmll as ref


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def ring_main(argv=None):
    ap = argparse.ArgumentParser(
        prog="tune_pmll.py ring", description="the PMLL ring's read and write tiles")
    ap.parse_args(argv)
    cli_gpu(ap, "ring times the PMLL ring's read and write")
    roof = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}  copy bandwidth {roof:.0f} GB/s")
    shapes = [  # (B, H, M, D, dtype)
        (8, 16, 8192, 128, torch.bfloat16),
        (8, 16, 4096, 128, torch.float32),
        (16, 16, 8192, 64, torch.bfloat16),
    ]
    configs = list(itertools.product([2048, 4096, 8192, 16384], [4, 8]))
    for batch, heads, cap, dim, dtype in shapes:
        mem = RingMemory.empty(batch, heads, cap, dim, dtype=dtype)
        mem.k.normal_()
        mem.v.normal_()
        mem.count.copy_(torch.arange(batch, device=mem.count.device) * (cap // 3) + cap // 2)
        print(f"\nB={batch} H={heads} M={cap} D={dim} {dtype}: ring {mem.nbytes() / 1e9:.2f} GB")
        segs = {T: pmll_inputs(0, batch, heads, T, dim, gate="bht", dtype=dtype)
                for T in (cap, 1024)}
        for tile, warps in configs:
            with settings.override(ring_tile_elems=tile, ring_num_warps=warps):
                # correctness on this config (small slice checked against float64)
                small = RingMemory(mem.k[:2, :2, :64].contiguous(), mem.v[:2, :2, :64].contiguous(),
                                   mem.count[:2].clone())
                x = pmll_inputs(1, 2, 2, 150, dim, gate="bht", dtype=dtype)
                rk, rv, rc = ref.ring_write(small.k, small.v, small.count, x["k_new"], x["v_new"], x["gate"])
                pmll_write(small, x["k_new"], x["v_new"], x["gate"])
                err = (small.k.double().cpu() - rk).abs().max().item()
                ko, _ = pmll_read(small, 5)
                ok = torch.equal(ko.double().cpu(), ref.ring_read(small.k, small.v, small.count, 5)[0])
                out = [f"tile {tile:5d} warps {warps}: check err {err:.1e} read_ok {ok}"]
                nb = read_bytes(mem.lengths, heads, cap, dim, 16, dtype=dtype)
                s = bench(lambda: pmll_read(mem, 16))
                out.append(f"read {nb / s / 1e9:6.0f} GB/s ({nb / s / 1e9 / roof:5.1%})")
                for T, x in segs.items():
                    for gate in (None, "bht"):
                        g = None if gate is None else x["gate"]
                        nb = write_bytes(batch, heads, cap, dim, T, dtype=dtype, gate=gate)
                        s = bench(lambda: pmll_write(mem, x["k_new"], x["v_new"], g))
                        out.append(f"w T={T} {gate or 'none'} {nb / s / 1e9:5.0f} ({nb / s / 1e9 / roof:5.1%})")
                print("  ".join(out), flush=True)
        del mem, segs
        torch.cuda.empty_cache()



SHAPES = [(8, 12, 64), (8, 16, 128)]            # (B, H, D): GPT-2 small's heads, and D = 128
CELLS = [(0, 1024), (1024, 256), (1024, 1024), (1024, 2048), (512, 512)]   # (M, T)


def tiles(quick: bool, stages: list[int]):
    if quick:
        grid = [(64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3),
                (128, 128, 8, 3), (64, 32, 4, 2), (128, 64, 8, 4), (128, 64, 4, 2)]
    else:
        grid = list(itertools.product([64, 128], [32, 64, 128], [4, 8], stages))
    return [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s) for m, n, w, s in grid]


def gpu_us(fn, replays=100) -> float:
    """CUDA graph replay median (us); on the CPU (a smoke run of this script) interpreter wall
    time, which says nothing about GPU speed."""
    if DEVICE.type == "cuda" and not INTERPRET:
        return time_cuda_graph(fn, replays=replays)["median_us"]
    return time_launch(fn, cpu_reps=1)["median_us"]


def attention_main(argv=None):
    ap = argparse.ArgumentParser(prog="tune_pmll.py attention",
                                 description="the fused ring attention's tiles")
    ap.add_argument("--quick", action="store_true", help="8 chosen tiles instead of the grid")
    ap.add_argument("--stages", default="2,3", help="pipeline stages of the grid (default %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES),
                    help="B,H,D;B,H,D... (default %(default)s)")
    ap.add_argument("--cells", default=";".join(",".join(map(str, c)) for c in CELLS),
                    help="M,T;M,T... (default %(default)s)")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    shapes = cli_ints(ap, "--shapes", args.shapes, group=3)
    cell_list = cli_ints(ap, "--cells", args.cells, least=0, group=2)   # M = 0: no memory
    stages = cli_ints(ap, "--stages", args.stages)
    name = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "CPU (interpreter)"
    print(f"device {name}  torch {torch.__version__}  dtype {args.dtype}")
    print(f"current attention_tiles: {settings.attention().attention_tiles}")
    t_start = time.time()
    for batch, heads, dim in shapes:
        block_d = max(16, 1 << (dim - 1).bit_length())
        cells, peer, want = {}, {}, {}
        for M, T in cell_list:
            x = speed_inputs(dict(B=batch, H=heads, D=dim, M=M, T=T, dtype=args.dtype, seed=0))
            cells[(M, T)] = x
            peer[(M, T)] = gpu_us(lambda x=x: sdpa_contiguous(x["q"], x["k_cat"], x["v_cat"]))
            want[(M, T)] = memory_attention(x["q"], x["k"], x["v"], x["mem"], impl="reference")
        rows = []
        for tile in tiles(args.quick, stages):
            cfg = dict(tile, BLOCK_C=min(tile["BLOCK_N"], tile["BLOCK_M"]), BLOCK_D=block_d)
            row = {"BLOCK_M": tile["BLOCK_M"], "BLOCK_N": tile["BLOCK_N"],
                   "warps": tile["num_warps"], "stages": tile["num_stages"]}
            ratios = []
            try:
                for (M, T), x in cells.items():
                    cfg_t = dict(cfg, BLOCK_M=min(cfg["BLOCK_M"], max(16, 1 << (T - 1).bit_length())))
                    cfg_t["BLOCK_C"] = min(cfg_t["BLOCK_C"], cfg_t["BLOCK_M"])

                    def call(x=x, c=cfg_t):
                        return ra.ring_attention(x["q"], x["k"], x["v"], x["mem"], tile=c)

                    err = errors(call(), want[(M, T)])["rel_l2"]
                    if not err <= TOL[args.dtype]:
                        raise RuntimeError(f"check failed at M={M}, T={T}: rel_l2 {err:.2e}")
                    us = gpu_us(call)
                    row[f"M{M}/T{T}"] = round(us, 1)
                    ratios.append(us / peer[(M, T)])
                row["geomean_vs_sdpa"] = round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
                row["worst_vs_sdpa"] = round(max(ratios), 3)
            except Exception as exc:  # noqa: BLE001 - an invalid tile (shared memory...) is a row
                row["error"] = f"{type(exc).__name__}: {exc}"[:120]
                if DEVICE.type == "cuda":
                    torch.cuda.synchronize()
            rows.append(row)
            print(f"  B={batch} H={heads} D={dim} {row}", flush=True)
        df = pd.DataFrame(rows)
        peer_row = {f"M{M}/T{T}": round(v, 1) for (M, T), v in peer.items()}
        print(f"\n== B={batch} H={heads} D={dim} {args.dtype}: CUDA graph replay, median us ==")
        print(f"SDPA contiguous keys, lower-right causal: {peer_row}")
        with pd.option_context("display.width", 250, "display.max_columns", None):
            print(df.sort_values("geomean_vs_sdpa").to_string(index=False))
        if "geomean_vs_sdpa" in df and df["geomean_vs_sdpa"].notna().any():
            best = df.loc[df["geomean_vs_sdpa"].idxmin()]
            el = torch.empty((), dtype=dtype).element_size()
            print(f"best: attention_tiles (({block_d}, {el}), ({int(best['BLOCK_M'])}, "
                  f"{int(best['BLOCK_N'])}, "
                  f"{int(best['warps'])}, {int(best['stages'])}))   # geomean {best['geomean_vs_sdpa']}x "
                  f"SDPA, worst {best['worst_vs_sdpa']}x\n")
        del cells, want
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    print(f"done in {time.time() - t_start:.0f} s")


COMMANDS = {"ring": ring_main, "attention": attention_main}


def main(argv=None):
    run_subcommand("tune_pmll.py", COMMANDS, argv)

if __name__ == "__main__":
    main()
