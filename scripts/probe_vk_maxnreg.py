"""The V-major exact verify held to fewer registers (``maxnreg`` added to the library's verify
launch): more programs resident per multiprocessor for a kernel bound by per-row latency, at
the cost of a few spills. Measured on the H200 and rejected (reports/perf-notes.md v16).

On sm_90 the fp32-state verify of the library (16-row tiles from ``B*HV > 128``) takes 168
registers: 12 one-warp programs per multiprocessor. 144 / 136 / 128 registers allow 14 / 15 /
16 (``python -m pmll_lab.lowering --layout vk --resources`` prints the counts; at 128
the compiler spills 96 bytes). ``maxnreg`` changes no arithmetic, so every setting must stay
bitwise equal to decoding: each is family-checked (``tune_gdn_vk.check_family`` at kd=128,
K=4, bf16 inputs) before it is timed. Times: ``tune_gdn_vk.timings`` (CUDA-graph replay with
the L2 flushed, median of 200, and do_bench), HK=16, HV=32, kd=vd=128, K=4, bf16 inputs, fp32
state; the verify at fixed pending counts (lazy without write-back 4, with 5; eager 3).
``8:8x1`` also times 8-row verify tiles (fewer registers by themselves).
Usage on a GPU:  python3 scripts/probe_vk_maxnreg.py [--B 1,16,64,256] [--regs 0,144,136,128]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_gdn_vk as T  # noqa: E402  (imports pmll_lab first)

from pmll_lab.ops.carry import gdn_carry, gdn_carry_vk  # noqa: E402

_ARGS_VK = gdn_carry._verify_launch_args_vk
MAXNREG = [0]


def _with_maxnreg(*args, **kwargs):
    """The library's V-major verify launch, compiled to ``MAXNREG[0]`` registers (0: as is)."""
    kernel, grid, a, kw = _ARGS_VK(*args, **kwargs)
    if MAXNREG[0] and kernel is gdn_carry_vk.gdn_carry_exact_vk_kernel:
        kw = dict(kw, maxnreg=MAXNREG[0])
    return kernel, grid, a, kw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", default="1,16,64,256")
    ap.add_argument("--regs", default="0,144,136,128", help="maxnreg values, 0: none")
    ap.add_argument("--tiles", default="default,8:8x1")
    a = ap.parse_args()
    gdn_carry._verify_launch_args_vk = _with_maxnreg
    T.KERNELS.update({"carry_exact_lazy:nowb", "carry_exact_lazy:wb", "carry_exact_eager"})
    roof = T.copy_bandwidth()
    print(f"device {T.device_name()}, copy roofline {roof:.0f} GB/s")
    Bs = [int(b) for b in a.B.split(",")]
    table = {}
    for spec in a.tiles.split(","):
        for regs in ([int(r) for r in a.regs.split(",")] if spec == "default" else [0]):
            MAXNREG[0] = regs                               # every batch width
            tag, over = T.tile_settings(T.parse_tile(spec))
            tag += f"/r{regs}" if regs else ""
            with T.settings.override(**over):
                bad = T.check_family(16, 32, 128, 4, T.DT["bf16"])
                print(f"{tag}: family {'bitwise' if not bad else 'DIFFERS ' + ', '.join(bad[:4])}",
                      flush=True)
                for B in Bs:
                    for name, (gu, bu, _) in T.timings(B, "vk").items():
                        table[(tag, B, name)] = gu
                        print(f"{tag:>14} B={B:<4} {name:<24} graph {gu:8.1f} us  do_bench "
                              f"{bu:8.1f} us", flush=True)
            MAXNREG[0] = 0
    base = "default"
    print("\nratio to the library (graph replay):")
    for (tag, B, name), gu in table.items():
        ref = table.get((base, B, name))
        if tag != base and ref:
            print(f"{tag:>14} B={B:<4} {name:<24} {gu:8.1f} / {ref:8.1f} = {gu / ref:.3f}")


if __name__ == "__main__":
    main()
