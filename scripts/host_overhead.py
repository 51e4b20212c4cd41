"""Host time of the decode and carry-verify launchers without the kernel launch (issue 5, B=1).

The Triton kernels are replaced by no-op stubs, so what is timed is the launchers' own Python:
argument checks, block configuration, output allocation, argument packing (Triton's own launch
path comes on top, on a GPU). Runs on any machine; on a CPU the interpreter is never entered.
Usage:  python scripts/host_overhead.py      (HV=32, HK=16, kd=vd=128, B=1, K=4, bf16 inputs)
Prints the mean microseconds per call (after 50 warm-up calls) and the carry launcher's profile.
"""

import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402,F401  (first: GPU or the Triton interpreter)
import pmll_lab.ops.carry.gdn_carry as C  # noqa: E402
import pmll_lab.ops.gdn.decode as D  # noqa: E402
from pmll_lab.carry import GdnCarry, gdn_carry_verify  # noqa: E402
from pmll_lab.gdn import gdn_decode  # noqa: E402
from pmll_lab.inputs import gdn_inputs  # noqa: E402


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def per_call_us(fn, calls=2000, warmup=50):
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    D.gdn_rows_kernel = _NoLaunch()
    for name in ("_gdn_carry_exact_split_kernel", "_gdn_carry_exact_kernel",
                 "_gdn_carry_wy_kernel", "_gdn_carry_wy_split_kernel"):
        setattr(C, name, _NoLaunch())
    x = gdn_inputs(0, 1, 16, 32, 128, 128, rows=4, slots=4)
    carry = GdnCarry.empty(4, 32, 128, 128)
    row = [x[n][:, 0] for n in ("q", "k", "v", "g", "beta")]
    rows = [x[n] for n in ("q", "k", "v", "g", "beta")]

    def decode():
        gdn_decode(x["state"], *row, state_indices=x["state_indices"])

    def verify():
        gdn_carry_verify(x["state"], carry, *rows, slot_tab=x["state_indices"], form="exact",
                         lazy=True)

    print(f"gdn_decode host time:       {per_call_us(decode):6.1f} us per call")
    print(f"gdn_carry_verify host time: {per_call_us(verify):6.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        verify()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(10)


if __name__ == "__main__":
    main()
