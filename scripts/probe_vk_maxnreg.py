"""The V-major exact verify held to fewer registers (``gdn_carry.VK_VERIFY_REGS``, the
``maxnreg`` of its launch): more programs resident per multiprocessor for a kernel bound by
per-row latency, at the cost of a few spills.

On sm_90 the fp32-state verify of the library (16-row tiles from ``B*HV > 128``) takes 168
registers: 12 one-warp programs per multiprocessor. 152 / 144 / 136 / 128 registers allow 13 /
14 / 15 / 16 (``python -m pmll_lab.lowering --layout vk --resources`` prints the counts; at 128
the compiler spills 96 bytes). ``maxnreg`` changes no arithmetic, so every setting must stay
bitwise equal to decoding: each is family-checked (``tune_gdn_vk.check_family`` at kd=128,
K=4, bf16 inputs) before it is timed. Times: ``tune_gdn_vk.timings`` (CUDA-graph replay with
the L2 flushed, median of 200, and do_bench), HK=16, HV=32, kd=vd=128, K=4, bf16 inputs, fp32
state; the verify at fixed pending counts (lazy without write-back 4, with 5; eager 3).
``8:8x1`` also times 8-row verify tiles (fewer registers by themselves).
Usage on a GPU:  python3 scripts/probe_vk_maxnreg.py [--B 1,16,64,256] [--regs 0,152,144,136,128]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_gdn_vk as T  # noqa: E402  (imports pmll_lab first)

from pmll_lab.ops.carry import gdn_carry  # noqa: E402

DEFAULT_REGS = gdn_carry.VK_VERIFY_REGS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", default="1,16,64,256")
    ap.add_argument("--regs", default="0,152,144,136,128", help="maxnreg values, 0: none")
    ap.add_argument("--tiles", default="default,8:8x1")
    a = ap.parse_args()
    T.KERNELS.update({"carry_exact_lazy:nowb", "carry_exact_lazy:wb", "carry_exact_eager"})
    roof = T.copy_bandwidth()
    print(f"device {T.device_name()}, copy roofline {roof:.0f} GB/s")
    Bs = [int(b) for b in a.B.split(",")]
    table = {}
    for spec in a.tiles.split(","):
        for regs in ([int(r) for r in a.regs.split(",")] if spec == "default" else [0]):
            gdn_carry.VK_VERIFY_REGS = ((1 << 62, regs),)   # every batch width
            tag = T.set_tile(T.parse_tile(spec)) + (f"/r{regs}" if regs else "")
            bad = T.check_family(16, 32, 128, 4, T.DT["bf16"])
            print(f"{tag}: family {'bitwise' if not bad else 'DIFFERS ' + ', '.join(bad[:4])}",
                  flush=True)
            for B in Bs:
                for name, (gu, bu, _) in T.timings(B, "vk").items():
                    table[(tag, B, name)] = gu
                    print(f"{tag:>14} B={B:<4} {name:<24} graph {gu:8.1f} us  do_bench "
                          f"{bu:8.1f} us", flush=True)
            T.recurrence.VK_TILES = T.DEFAULT_TILES
            gdn_carry.VK_VERIFY_REGS = DEFAULT_REGS
    base = "default"
    print("\nratio to the library (graph replay):")
    for (tag, B, name), gu in table.items():
        ref = table.get((base, B, name))
        if tag != base and ref:
            print(f"{tag:>14} B={B:<4} {name:<24} {gu:8.1f} / {ref:8.1f} = {gu / ref:.3f}")


if __name__ == "__main__":
    main()
