"""Pieces shared by every causal-conv kernel (SPEC §3c): block config, Triton helpers, checks.

Tiling. A program works on one sequence and a block of channels laid out as a 2-D tile
``[ROWS, WP]``: channel ``c = row * W + lane`` (lanes ``>= W`` masked), where the row width ``W``
is the l2norm group size ``head_dim``. A row below ``qk_channels`` is exactly one l2norm group,
so a program always holds whole groups and normalises them with a reduction over its own
registers: no group is split across programs, whatever ``head_dim`` is (not only powers of two).
Windows are handled as 3-D tiles ``[ROWS, WP, SLP]`` (``SLP`` = ``state_len`` padded to a power of
two).

The sequence view. Every kernel reads a sequence's inputs as one logical sequence
``seq = [window (state_len columns) | pending stash rows 0..p-1 | new rows x_0..x_{K-1}]``
(``p = 0`` without a carry). Row ``t``'s output uses ``seq[state_len + p + t - (d_conv-1) + i]``
for tap ``i``, and the window after ``m`` of those inputs is ``seq[m .. m + state_len - 1]``. The
helper ``seq_load`` fetches ``seq[n]`` straight from the window, stash or input buffer, so that no
kernel shifts registers and every value stored in a window or stash is an exact copy of an input.

Ownership. Each program reads and writes only its own channels of its own slot (the conv is
depthwise), so programs of one launch never share window or stash entries: no cross-program race
(SPEC §3b "Shared rows"). Inside a program, every read of a window or stash entry happens before
``tl.debug_barrier()`` and every write after it, so the 2-D and 3-D tile layouts (different
threads per element) cannot race either.

Bitwise agreement. ``conv_taps`` and ``conv_activate`` carry all the arithmetic, with explicit
``fma`` in a fixed tap order, and the one reduction (the l2norm's sum of squares) in the fixed
pairwise order of ``row_sum_pairwise``, so no result depends on a register layout and so on the
alignment of the buffers or views passed in. Every kernel launches with ``conv_block_config``:
conv_update, conv_chain, the carry verify and (for windows) the flush give bit-identical
results.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops import settings
from pmll_lab.ops.host import cdiv, next_power_of_2

MAX_ROWS = 16
"""Most rows K a conv_chain launch unrolls (the verify uses K <= CAP = 8)."""

INPUT_DTYPES = (torch.float32, torch.bfloat16)


def conv_block_config(dim: int, head_dim: int | None) -> tuple[int, int, int, int]:
    """``(W, WP, ROWS, num_warps)``: row width, padded row width, rows per program, warps.

    Every conv kernel of one run must use the same config (bitwise agreement): it depends only
    on ``dim``, ``head_dim`` and the ``conv`` launch settings (``pmll_lab.ops.settings``)."""
    cs = settings.conv()
    w = int(head_dim) if head_dim else cs.conv_row_width
    wp = next_power_of_2(w)
    rows_total = cdiv(dim, w)
    rows = max(1, min(cs.conv_block_channels // wp, next_power_of_2(rows_total)))
    return w, wp, rows, cs.conv_num_warps


# ---- Triton helpers ---------------------------------------------------------------------------

@triton.jit
def tile_channels(pid_c, dim, W: tl.constexpr, WP: tl.constexpr, ROWS: tl.constexpr):
    """Channel indices ``[ROWS, WP]`` (int64) of program ``pid_c``, their mask, and row ids."""
    rows = pid_c * ROWS + tl.arange(0, ROWS)
    lanes = tl.arange(0, WP)
    ch = rows[:, None] * W + lanes[None, :]
    cmask = (lanes[None, :] < W) & (ch < dim)
    return ch.to(tl.int64), cmask, rows


@triton.jit
def seq_load(win_ptrs, stride_wj, stash_ptrs, stride_sr, x_ptrs, stride_xk, n, p, mask,
             SL: tl.constexpr, HAS_STASH: tl.constexpr):
    """``seq[n]`` for the channels at ``win_ptrs`` / ``stash_ptrs`` / ``x_ptrs`` (column 0 / row 0
    pointers, broadcastable against ``n``): window column ``n`` if ``n < SL``, else stash row
    ``n - SL`` if that is one of the ``p`` pending rows, else input row ``n - SL - p``. Values
    in the buffers' dtype (exact copies); masked lanes give 0."""
    in_win = n < SL
    v = tl.load(win_ptrs + n * stride_wj, mask=mask & in_win, other=0.0)
    if HAS_STASH:
        in_stash = (n >= SL) & (n < SL + p)
        vs = tl.load(stash_ptrs + (n - SL) * stride_sr, mask=mask & in_stash, other=0.0)
        v = tl.where(in_stash, vs, v)
    in_x = n >= SL + p
    vx = tl.load(x_ptrs + (n - SL - p) * stride_xk, mask=mask & in_x, other=0.0)
    return tl.where(in_x, vx, v)


@triton.jit
def conv_taps(acc, w_ptrs, stride_wd, win_ptrs, stride_wj, stash_ptrs, stride_sr, x_ptrs,
              stride_xk, n0, p, cmask, D: tl.constexpr, SL: tl.constexpr,
              HAS_STASH: tl.constexpr):
    """``acc + sum_i w[:, i] * seq[n0 + i]`` in fp32, taps in order ``i = 0..D-1`` with fma."""
    for i in tl.static_range(D):
        w = tl.load(w_ptrs + i * stride_wd, mask=cmask, other=0.0).to(tl.float32)
        v = seq_load(win_ptrs, stride_wj, stash_ptrs, stride_sr, x_ptrs, stride_xk, n0 + i, p,
                     cmask, SL, HAS_STASH).to(tl.float32)
        acc = tl.fma(w, v, acc)
    return acc


@triton.jit
def row_sum_pairwise(x, ROWS: tl.constexpr):
    """Sum of ``x [ROWS, WP]`` (``WP`` a power of two <= 4096) along its rows in a fixed
    pairwise order (``((x0+x1) + (x2+x3)) + ...``), written out with reshape/split so that the
    order does not depend on the register layout the compiler picks: ``tl.sum``'s does, and the
    layout follows the alignment Triton sees on the input pointers (seen on the H200 by the GDN
    kernels, ``pmll_lab/ops/gdn/recurrence.py``). Returns ``[ROWS]``."""
    for _ in tl.static_range(12):
        if x.shape[1] > 1:
            a, b = tl.split(tl.reshape(x, (ROWS, x.shape[1] // 2, 2)))
            x = a + b
    return tl.reshape(x, (ROWS,))


@triton.jit
def conv_activate(acc, rows, cmask, qk_channels, l2_eps, W: tl.constexpr,
                  SILU: tl.constexpr, HAS_QK: tl.constexpr):
    """SiLU (``x / (1 + exp(-x))``), then each row below ``qk_channels`` (one l2norm group)
    scaled by ``rsqrt(sum(y*y) + l2_eps)``, the sum in ``row_sum_pairwise``'s fixed order.
    ``acc [ROWS, WP]`` fp32."""
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    if HAS_QK:
        sq = tl.where(cmask, acc * acc, 0.0)
        inv = tl.math.rsqrt(row_sum_pairwise(sq, acc.shape[0]) + l2_eps)
        is_qk = rows * W < qk_channels
        acc = acc * tl.where(is_qk, inv, 1.0)[:, None]
    return acc


@triton.jit
def conv_output_row(t, w_ptrs, stride_wd, bias_ptrs, win_ptrs, stride_wj, stash_ptrs, stride_sr,
                    x_ptrs, stride_xk, p, cmask, rows, qk_channels, l2_eps,
                    D: tl.constexpr, SL: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
                    ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                    HAS_QK: tl.constexpr, HAS_STASH: tl.constexpr):
    """Output of new row ``t`` (fp32 ``[ROWS, WP]``): bias, taps, activation, l2norm."""
    if HAS_BIAS:
        acc = tl.load(bias_ptrs, mask=cmask, other=0.0).to(tl.float32)
    else:
        acc = tl.zeros((ROWS, WP), dtype=tl.float32)
    acc = conv_taps(acc, w_ptrs, stride_wd, win_ptrs, stride_wj, stash_ptrs, stride_sr, x_ptrs,
                    stride_xk, SL + p + t - (D - 1), p, cmask, D, SL, HAS_STASH)
    return conv_activate(acc, rows, cmask, qk_channels, l2_eps, W, SILU, HAS_QK)


# ---- host-side checks -------------------------------------------------------------------------

def check_device(name: str, t: torch.Tensor) -> None:
    """Kernels run on ``pmll_lab.backend.DEVICE``'s type (cuda, or cpu through the interpreter)."""
    if t.device.type != DEVICE.type:
        raise ValueError(f"{name}: kernels run on {DEVICE.type} here, got a tensor on {t.device}")


def check_conv_args(conv_state, x, weight, bias, *, rows: bool, activation, qk_channels,
                    head_dim, l2_eps, out_dtype):
    """Checks shared by conv_update, conv_chain and the carry verify. Returns
    ``(B, K, dim, d_conv, state_len, out_dtype)``."""
    _checks.tensor("conv_state", conv_state, ndim=3, dtype=INPUT_DTYPES)
    check_device("conv_state", conv_state)
    dtype, dev = conv_state.dtype, conv_state.device
    S, dim, state_len = conv_state.shape
    _checks.tensor("x", x, ndim=3 if rows else 2, dtype=dtype, device=dev, last_contiguous=True)
    if x.shape[-1] != dim:
        raise ValueError(f"x: last dim must be dim = {dim} (conv_state.shape[1]), got {tuple(x.shape)}")
    _checks.tensor("weight", weight, ndim=2, dtype=dtype, device=dev)
    if weight.shape[0] != dim:
        raise ValueError(f"weight: expected shape ({dim}, d_conv), got {tuple(weight.shape)}")
    d_conv = weight.shape[1]
    if d_conv < 1:
        raise ValueError(f"weight: d_conv (shape[1]) must be >= 1, got {d_conv}")
    if state_len < max(1, d_conv - 1):
        raise ValueError(f"conv_state: state_len (shape[2]) must be >= max(1, d_conv - 1) = "
                         f"{max(1, d_conv - 1)}, got {state_len}")
    if bias is not None:
        _checks.tensor("bias", bias, shape=(dim,), dtype=dtype, device=dev)
    _checks.choice("activation", activation, (None, "silu"))
    _checks.positive_int("qk_channels", qk_channels, minimum=0, maximum=dim)
    if qk_channels:
        if head_dim is None:
            raise ValueError("head_dim: required when qk_channels > 0")
        _checks.positive_int("head_dim", head_dim)
        if qk_channels % head_dim:
            raise ValueError(f"qk_channels: must be a multiple of head_dim = {head_dim}, got {qk_channels}")
    elif head_dim is not None:
        _checks.positive_int("head_dim", head_dim)
    _checks.positive_float("l2_eps", l2_eps)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in (x.dtype, torch.float32):
        raise ValueError(f"out_dtype: must be x's dtype or float32, got {out_dtype}")
    B = x.shape[0]
    K = x.shape[1] if rows else 1
    return B, K, dim, d_conv, state_len, out_dtype


def check_values(conv_state, x, weight, bias, slot_tab, B) -> None:
    """``validate=True``'s finite rule (``pmll_lab._checks``): ``x`` on the live lanes,
    ``weight`` and ``bias``, and the windows of the slots the lanes read. ``ValueError`` naming
    the argument (a window: ``conv_state`` and the slot)."""
    live = None if slot_tab is None else slot_tab >= 0
    _checks.finite_inputs({"x": x}, live, {"weight": weight, "bias": bias})
    _checks.finite_slots("conv_state", conv_state,
                         _checks.live_slots(slot_tab, B, conv_state.device))


def check_indices(name: str, idx, batch: int, slots: int, dev) -> torch.Tensor:
    """``idx [batch]`` int32/int64 on ``dev``, contiguous (the kernels read entry ``b`` at offset
    ``b``), and ``batch <= slots`` (distinct slots cannot be more than the slots). Shape, dtype,
    device, strides only: values need ``validate``."""
    _checks.tensor(name, idx, shape=(batch,), dtype=(torch.int32, torch.int64), device=dev,
                   contiguous=True)
    if batch > slots:
        raise ValueError(f"{name}: {batch} sequences but only {slots} slots")
    return idx
