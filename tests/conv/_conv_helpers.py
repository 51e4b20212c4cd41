"""Shared by the conv tests (test_conv.py, test_conv_carry.py): shapes, tolerances, checks.

Tolerances (relative L2 against the float64 reference, ``pmll_lab.bench.errors``): outputs in
fp32 ``TOL_F32 = 1e-5`` (fp32 arithmetic over d_conv <= 4 taps, then SiLU and the l2norm: a few
ulp); outputs in bf16 ``TOL_BF16 = 8e-3`` (one bf16 rounding, 2**-9 relative, dominates).
``_same`` asserts bitwise equality with the float64 reference (windows, stash rows);
``_guarded`` / ``_outside`` build views inside random sentinel buffers and read what lies outside.
"""

from __future__ import annotations

import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors

TOL_F32 = 1e-5
TOL_BF16 = 8e-3

# Small Qwen3-Next-shaped conv: HK=2, HV=4, kd=vd=32 -> qk_channels 128, dim 256.
QK, HD = 128, 32
DIM = 2 * 2 * 32 + 4 * 32
# Several channel-block programs per sequence (race exposure): HK=4, HV=8, kd=vd=32 -> dim 512.
QK_WIDE, DIM_WIDE = 256, 512


def _tol(dtype):
    return TOL_F32 if dtype == torch.float32 else TOL_BF16


def _check_close(out, expect, tol, what):
    e = errors(out, expect)
    assert e["rel_l2"] <= tol, f"{what}: rel_l2 {e['rel_l2']:.3g} > {tol} (max_abs {e['max_abs']:.3g})"


def _same(out, expect_f64, what):
    """``out`` holds exactly the float64 reference's values (windows, stash)."""
    assert bitwise_equal(out, expect_f64.to(out.device, out.dtype)), f"{what}: not bitwise equal"
    assert torch.equal(out.double().cpu(), expect_f64), f"{what}: reference not representable"


def _guarded(gen, shape, region, dtype):
    """A bigger buffer of random sentinels and the view ``big[region]`` of ``shape``."""
    big_shape = [s.stop + 2 if isinstance(s, slice) else s for s in region]
    big = torch.randn(*big_shape, generator=gen).to(dtype).to(DEVICE)
    view = big[region]
    assert tuple(view.shape) == tuple(shape)
    return big, view


def _outside(big, region):
    mask = torch.ones(big.shape, dtype=torch.bool, device=big.device)
    mask[region] = False
    return big[mask].clone()

