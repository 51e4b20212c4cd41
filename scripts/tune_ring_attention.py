"""Launch tiles for the fused PMLL ring attention (pmll_lab/ops/pmll/ring_attention.py), on the GPU.

For each head shape and a few (ring capacity M, segment length T) cells, times the kernel over
``BLOCK_M x BLOCK_N x num_warps x num_stages`` by CUDA graph replay (``bench.time_cuda_graph``,
GPU time, L2 flushed before each replay), beside PyTorch SDPA over the same keys laid out
contiguously with a lower-right causal bias (the bound the kernel is held to). Each tile is first
checked against the reference path on the cell's inputs. Prints one table per shape (us per
cell, the geometric mean of time / SDPA) and the ``attention_tiles`` rows
(``pmll_lab.ops.settings``) of the best tiles.

Run on a GPU, from the project root: ``python scripts/tune_ring_attention.py``: 24 tiles
(``BLOCK_M`` 64/128, ``BLOCK_N`` 32/64/128, 4/8 warps, ``--stages`` 2,3) x 2 shapes x 5 cells;
compiling dominates (two variants per tile and shape, with and without a ring), so a run may take
several minutes; ``--quick`` tries 8 chosen tiles, ``--shapes 8,12,64`` one shape, ``--dtype
float16|float32`` another dtype. Without a GPU it runs in the interpreter as a smoke test
(wall times, no meaning).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import pmll_lab  # noqa: F401  (first)

import pandas as pd
import torch

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import errors, time_cuda_graph, time_launch
from pmll_lab.experiments.pmll_attention import TOL, sdpa_contiguous, speed_inputs
from pmll_lab.ops import settings
from pmll_lab.ops.pmll import ring_attention as ra
from pmll_lab.pmll import memory_attention

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


def _pairs(text: str, n: int) -> list[tuple[int, ...]]:
    out = [tuple(int(v) for v in item.split(",")) for item in text.split(";") if item]
    if any(len(o) != n for o in out):
        raise SystemExit(f"expected ';'-separated groups of {n} comma-separated ints: {text!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 chosen tiles instead of the grid")
    ap.add_argument("--stages", default="2,3", help="pipeline stages of the grid (default %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES),
                    help="B,H,D;B,H,D... (default %(default)s)")
    ap.add_argument("--cells", default=";".join(",".join(map(str, c)) for c in CELLS),
                    help="M,T;M,T... (default %(default)s)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes, cell_list = _pairs(args.shapes, 3), _pairs(args.cells, 2)
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
        for tile in tiles(args.quick, [int(v) for v in args.stages.split(",")]):
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


if __name__ == "__main__":
    main()
