"""Tile size and warps for the PMLL ring kernels (pmll_lab/ops/pmll/ring.py), on the GPU.

Times ``pmll_read`` and ``pmll_write`` (do_bench median) over the ``ring_tile_elems`` x
``ring_num_warps`` settings (``pmll_lab.ops.settings``) on
rings several times the L2 (0.5-1 GB of k + v), and prints GB/s over the fewest bytes each must
move (``pmll_lab.pmll.read_bytes`` / ``write_bytes``) as a fraction of the measured copy
bandwidth. Each config is checked against the float64 reference on a slice first. Run on a GPU:
``python scripts/tune_pmll_ring.py``; the log of the run that chose the constants is in
``reports/``.
"""

from __future__ import annotations

import itertools

import pmll_lab  # noqa: F401  (first)

import torch
import triton.testing

from pmll_lab.bench import copy_bandwidth
from pmll_lab.inputs import pmll_inputs
from pmll_lab.ops import settings
from pmll_lab.pmll import RingMemory, pmll_read, pmll_write, read_bytes, write_bytes
from pmll_lab.reference import pmll as ref


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def main():
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


if __name__ == "__main__":
    main()
