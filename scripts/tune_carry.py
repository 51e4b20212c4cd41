"""GPU tuning sweep for the carried-state verify: the exact form with and without its column
blocks split across programs (``exact_split_columns``), and FLA over the same K rows, at HV=32,
HK=16, kd=vd=128, bf16 inputs, fp32 state.

For each variant: seeded inputs, a stash holding ``p`` pending rows (p=3: no write-back at K=4;
p=5: write-back, as the lazy form does on ~half of the verifies at a mean accepted length of
3.3), a check before timing (each variant against the per-head exact form, which the tests hold
bitwise equal to plain decoding: outputs rel L2 <= 8e-3 in bf16, stashed u rows <= 1e-4), then the
do_bench median and its fraction of the copy roofline over the fewest bytes (state read once,
written on a write-back, p pending + K new stash rows, inputs and outputs).

Usage on the H200:  python3 scripts/tune_carry.py            (prints a table; ~1 minute)
Smoke test on CPU:  PMLL_LAB_DEVICE=cpu python3 scripts/tune_carry.py --smoke
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pmll_lab  # noqa: E402  (first: GPU or the Triton interpreter)
import torch  # noqa: E402

from pmll_lab.backend import DEVICE, device_name  # noqa: E402
from pmll_lab.bench import bitwise_equal, copy_bandwidth, errors, time_launch  # noqa: E402
from pmll_lab.carry import GdnCarry, gdn_carry_verify  # noqa: E402
from pmll_lab.gdn import row_io_bytes, state_bytes  # noqa: E402
from pmll_lab.inputs import gdn_inputs, generator  # noqa: E402
from pmll_lab.ops import settings  # noqa: E402
from pmll_lab.peers import fla_available, fla_runner  # noqa: E402


def case(B, K, HK, HV, D, pend, seed=0):
    x = gdn_inputs(seed, B, HK, HV, D, D, rows=K, slots=B, dtype=torch.bfloat16)
    carry = GdnCarry.empty(B, HV, D, D, device=DEVICE)
    gen = generator(seed + 1)
    carry.buf.copy_(torch.randn(carry.buf.shape, generator=gen).mul_(0.1))
    carry.g.copy_(-torch.rand(carry.g.shape, generator=gen))
    k = torch.randn(carry.k.shape, generator=gen)
    carry.k.copy_(k / k.norm(dim=-1, keepdim=True))
    carry.pend.fill_(pend)
    return x, carry


def nbytes(B, K, HK, HV, D, pend, wb):
    row = 4 * (HV * D + HV + HV * D)
    return B * (state_bytes(HV, D, D) * (2 if wb else 1) + (pend + K) * row
                + K * row_io_bytes(HK, HV, D, D, torch.bfloat16))


def run_variant(x, carry0, lazy):
    """The exact verify on copies of the state and stash: ``(call, o, carry, engaged)``. Call
    it, and time what it returns, inside ``settings.override(exact_split_columns=...)``
    (``"exact"``: one program per head; ``"exact-split"``: column blocks across programs)."""
    state, carry = x["state"].clone(), _clone(carry0)
    slot = x["state_indices"]

    def f():
        return gdn_carry_verify(state, carry, x["q"], x["k"], x["v"], x["g"], x["beta"],
                                slot_tab=slot, form="exact", lazy=lazy)
    o, engaged = f()
    return f, o, carry, engaged


def _clone(c):
    out = GdnCarry.empty(c.slots, c.num_v_heads, c.k_dim, c.v_dim, cap=c.cap, device=DEVICE)
    out.buf.copy_(c.buf)
    out.pend.copy_(c.pend)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, no timing (CPU check)")
    a = ap.parse_args()
    HK, HV, D, K = (1, 2, 16, 2) if a.smoke else (16, 32, 128, 4)
    batches = (2,) if a.smoke else (64, 128)
    roof = copy_bandwidth()
    print(f"device {device_name()}; copy roofline {roof and round(roof)} GB/s", flush=True)
    variants = ("exact", "exact-split")
    for B in batches:
        for pend in (3, 5) if not a.smoke else (1,):
            wb = pend + K > 8
            x, carry0 = case(B, K, HK, HV, D, pend)
            with settings.override(exact_split_columns=False):
                _, o_ref, c_ref, _ = run_variant(x, carry0, True)
            nb = nbytes(B, K, HK, HV, D, pend, wb)
            for form in variants:
                with settings.override(exact_split_columns=form == "exact-split"):
                    f, o, c, engaged = run_variant(x, carry0, True)
                    eo = errors(o, o_ref)["rel_l2"]
                    eu = errors(c.buf, c_ref.buf)["rel_l2"]
                    ok = eo <= 8e-3 and eu <= 1e-4 and bool((engaged == (2 if wb else 1)).all())
                    same = bitwise_equal(o, o_ref) and bitwise_equal(c.buf, c_ref.buf)
                    line = (f"B={B:3d} K={K} pend={pend} wb={int(wb)} {form:11s} "
                            f"o_err {eo:.1e} u_err {eu:.1e} "
                            f"bitwise={int(same)} {'ok' if ok else 'CHECK FAILED'}")
                    if ok and not a.smoke:
                        t = time_launch(f, warmup_ms=10, rep_ms=50)["median_us"]
                        gbps = nb / (t * 1e-6) / 1e9
                        line += f"  {t:8.1f} us  {gbps:6.0f} GB/s  {gbps / roof:5.1%}"
                print(line, flush=True)
            if fla_available():
                run, gva = fla_runner(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      x["state"][x["state_indices"].long()].contiguous(),
                                      scale=D ** -0.5)
                t = time_launch(run, warmup_ms=10, rep_ms=50)["median_us"]
                print(f"B={B:3d} K={K} FLA fused_recurrent (GVA {gva}): {t:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
