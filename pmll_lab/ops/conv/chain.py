"""Causal depthwise conv: one token (``conv_update``) and the K-row chain (``conv_chain``).

SPEC §3c. Both launch one kernel, ``_conv_chain_kernel`` (``conv_update`` is the chain with
``K = 1`` and no intermediate windows), so the per-row arithmetic is the same code and the chain
equals successive updates bit for bit. Helpers and tiling: ``pmll_lab.ops.conv.common``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.ops.conv.common import (
    check_values,
    MAX_ROWS,
    check_conv_args,
    check_indices,
    conv_block_config,
    conv_output_row,
    seq_load,
    tile_channels,
)
from pmll_lab.ops.host import cdiv, next_power_of_2


@triton.jit
def _conv_chain_kernel(
    state_ptr, x_ptr, w_ptr, bias_ptr, y_ptr, inter_ptr, idx_ptr,
    dim, qk_channels, l2_eps,
    s_s, s_c, s_j,
    x_b, x_k,
    w_c, w_d,
    b_c,
    y_b, y_k,
    i_b, i_t, i_c, i_j,
    K: tl.constexpr, D: tl.constexpr, SL: tl.constexpr, SLP: tl.constexpr,
    W: tl.constexpr, WP: tl.constexpr, ROWS: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr, HAS_QK: tl.constexpr,
    HAS_INTER: tl.constexpr, HAS_IDX: tl.constexpr,
):
    """Grid ``(channel blocks, B)``. Reads the slot's window and the K input rows; writes the K
    outputs, the window after each row ``t < K-1`` (if ``HAS_INTER``) and the final window. A
    slot of -1 is a padding lane: zero outputs, no window or intermediate access."""
    pid_c = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if HAS_IDX:
        slot = tl.load(idx_ptr + b).to(tl.int64)
    else:
        slot = b
    live = slot >= 0                     # slot -1: a padding lane (zero outputs, no window access)
    slot = tl.maximum(slot, 0)
    ch, cmask_out, rows = tile_channels(pid_c, dim, W, WP, ROWS)
    cmask = cmask_out & live
    win = state_ptr + slot * s_s + ch * s_c          # column 0 of the window, [ROWS, WP]
    xs = x_ptr + b * x_b + ch                        # row 0 of the inputs
    ws = w_ptr + ch * w_c
    bs = bias_ptr + ch * b_c
    cols = tl.arange(0, SLP)[None, None, :]
    win3 = win[:, :, None]
    xs3 = xs[:, :, None]
    mask3 = cmask[:, :, None] & (cols < SL)
    p = 0
    for t in tl.static_range(K):
        y = conv_output_row(t, ws, w_d, bs, win, s_j, xs, 0, xs, x_k, p, cmask, rows,
                            qk_channels, l2_eps, D, SL, W, WP, ROWS, HAS_BIAS, SILU, HAS_QK,
                            False)
        tl.store(y_ptr + b * y_b + t * y_k + ch, tl.where(live, y, 0.0).to(y_ptr.dtype.element_ty),
                 mask=cmask_out)
        if HAS_INTER:
            if t < K - 1:
                after = seq_load(win3, s_j, xs3, 0, xs3, x_k, t + 1 + cols, p, mask3, SL, False)
                tl.store(inter_ptr + b * i_b + t * i_t + ch[:, :, None] * i_c + cols * i_j,
                         after, mask=mask3)
    final = seq_load(win3, s_j, xs3, 0, xs3, x_k, K + cols, p, mask3, SL, False)
    tl.debug_barrier()   # every read of the window above, every write below
    tl.store(win3 + cols * s_j, final, mask=mask3)


def _launch_chain(conv_state, x3, weight, bias, state_indices, intermediate, y3, *, K, dim,
                  d_conv, state_len, activation, qk_channels, head_dim, l2_eps):
    B = x3.shape[0]
    W, WP, ROWS, num_warps = conv_block_config(dim, head_dim)
    grid = (cdiv(cdiv(dim, W), ROWS), B)
    inter = intermediate if intermediate is not None else y3
    i_strides = intermediate.stride() if intermediate is not None else (0, 0, 0, 0)
    _conv_chain_kernel[grid](
        conv_state, x3, weight, bias if bias is not None else weight, y3, inter,
        state_indices if state_indices is not None else x3,
        dim, qk_channels, float(l2_eps),
        *conv_state.stride(), x3.stride(0), x3.stride(1), *weight.stride(),
        bias.stride(0) if bias is not None else 0, y3.stride(0), y3.stride(1), *i_strides,
        K=K, D=d_conv, SL=state_len, SLP=next_power_of_2(state_len),
        W=W, WP=WP, ROWS=ROWS, HAS_BIAS=bias is not None, SILU=activation == "silu",
        HAS_QK=qk_channels > 0, HAS_INTER=intermediate is not None and K > 1,
        HAS_IDX=state_indices is not None, num_warps=num_warps,
    )


def conv_update(conv_state, x, weight, bias=None, *, state_indices=None, activation="silu",
                qk_channels=0, head_dim=None, l2_eps=1e-6, out_dtype=None, validate=False,
                carry=None, impl="triton"):
    """One token of the causal depthwise conv per sequence, window updated in place (SPEC §3c).

    Args:
        conv_state: ``[S, dim, state_len]`` fp32 or bf16, any strides; slot ``s``'s window,
            oldest column first, ``state_len >= max(1, d_conv - 1)``. The slots in
            ``state_indices`` are shifted by one column (the new input enters last); other slots
            are not touched.
        x: ``[B, dim]`` in ``conv_state``'s dtype; any row stride, last dim contiguous (a strided
            view of a fused projection is read in place).
        weight: ``[dim, d_conv]``, bias: ``[dim]`` or None, in the same dtype.
        state_indices: ``[B]`` int32/int64 slots, contiguous, ``B <= S`` (default
            ``arange(B)``). -1 marks a padding lane (vLLM's ``PAD_SLOT_ID``): its outputs are
            zeros and no window is read or written for it; other out-of-range slots are
            undefined behaviour without ``validate``.
        activation: ``"silu"`` or None. qk_channels: the first ``qk_channels`` channels are
            l2-normalised in groups of ``head_dim`` (``x * rsqrt(sum(x*x) + l2_eps)``);
            ``qk_channels`` must be a multiple of ``head_dim``. 0 turns it off.
        out_dtype: dtype of ``y``: ``x.dtype`` (default) or float32.
        validate: also check (one device sync; ``pmll_lab._checks``; docs/layouts.md,
            "validate=True") ``state_indices`` values (in ``[0, S)`` and distinct, or -1), that
            ``x`` on the live lanes, ``weight``, ``bias`` and the windows read are finite and, with
            ``carry``, that no slot updated holds pending carry inputs. Slot tables on the host (a
            CPU run) are checked always, range and distinct (free there).
        carry: ``None`` or the layer's ``ConvCarry`` (anything with ``pend [S]`` int32), for
            ``validate``'s pending check. A slot whose carry holds accepted inputs not yet
            shifted into its window (``pend > 0``) must not run a plain update: it would start
            from a stale window and give wrong outputs and a wrong window, silently. Flush
            first (``conv_carry_flush``).
        impl: ``"triton"`` only (the conv has no CUDA twin).

    ``conv_state`` must share no memory with ``x``, the weights or ``state_indices`` (nor, in
    ``conv_chain``, with ``intermediate``): ``ValueError`` naming both.

    Returns ``y [B, dim]``. Arithmetic in fp32: ``y = silu(bias + sum_j w[:, j] * v[:, j])``
    over ``v = [last d_conv-1 window columns, x]``, then the l2norm.

    Raises ``ValueError`` naming the argument for wrong shapes, dtypes, devices, strides,
    options, and (``validate=True``) bad slot values.
    Source: Qwen3-Next's ``causal_conv1d_update`` + q/k l2norm (HF transformers), SPEC §3c.
    """
    _checks.impl("conv_update", impl)
    B, _, dim, d_conv, state_len, out_dtype = check_conv_args(
        conv_state, x, weight, bias, rows=False, activation=activation,
        qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps, out_dtype=out_dtype)
    _check_slots(conv_state, state_indices, B, validate, carry)
    if validate:
        check_values(conv_state, x, weight, bias, state_indices, B)
    _check_apart(conv_state, None, x, weight, bias, state_indices)
    y = torch.empty(B, dim, dtype=out_dtype, device=x.device)
    if B == 0:
        return y
    _launch_chain(conv_state, x[:, None, :], weight, bias, state_indices, None, y[:, None, :],
                  K=1, dim=dim, d_conv=d_conv, state_len=state_len, activation=activation,
                  qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps)
    return y


def conv_chain(conv_state, x, weight, bias=None, *, state_indices=None, intermediate=None,
               activation="silu", qk_channels=0, head_dim=None, l2_eps=1e-6, out_dtype=None,
               validate=False, carry=None, impl="triton"):
    """K tokens per sequence in one launch, with the window after each row kept (SPEC §3a/§3c).

    ``x [B, K, dim]`` (``1 <= K <= 16``; any strides on ``B`` and ``K``, last dim contiguous);
    other arguments as in ``conv_update``. The window at each slot is left as after the last row;
    when ``intermediate [B, K-1, dim, state_len]`` (``conv_state``'s dtype, any strides) is
    given, the window after row ``t < K-1`` of sequence ``b`` is written to
    ``intermediate[b, t]`` (the snapshot baseline: after acceptance of ``a`` rows the caller
    keeps window ``a-1``; a padding lane's entries are not written). Returns ``y [B, K, dim]``.

    Bitwise equal to ``K`` successive ``conv_update`` launches (outputs, windows): the same kernel
    body computes every row. ``carry``, ``impl``: as in ``conv_update``. Raises ``ValueError``
    as ``conv_update`` does, and for ``K`` out of range or a mis-shaped ``intermediate``.
    """
    _checks.impl("conv_chain", impl)
    B, K, dim, d_conv, state_len, out_dtype = check_conv_args(
        conv_state, x, weight, bias, rows=True, activation=activation,
        qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps, out_dtype=out_dtype)
    if not 1 <= K <= MAX_ROWS:
        raise ValueError(f"x: rows K (shape[1]) must be in 1..{MAX_ROWS}, got {K}")
    if intermediate is not None:
        _checks.tensor("intermediate", intermediate, shape=(B, K - 1, dim, state_len),
                       dtype=conv_state.dtype, device=conv_state.device)
        _checks.no_overlap("intermediate", intermediate)
    _check_slots(conv_state, state_indices, B, validate, carry)
    if validate:
        check_values(conv_state, x, weight, bias, state_indices, B)
    _check_apart(conv_state, intermediate, x, weight, bias, state_indices)
    y = torch.empty(B, K, dim, dtype=out_dtype, device=x.device)
    if B == 0:
        return y
    _launch_chain(conv_state, x, weight, bias, state_indices, intermediate, y, K=K, dim=dim,
                  d_conv=d_conv, state_len=state_len, activation=activation,
                  qk_channels=qk_channels, head_dim=head_dim, l2_eps=l2_eps)
    return y


def _check_slots(conv_state, state_indices, B, validate, carry=None):
    """The slot table (host: range always; ``validate``: range, distinct) and, with ``carry``
    and ``validate``, no slot holding pending carry inputs."""
    _checks.flag("validate", validate)
    S = conv_state.shape[0]
    if carry is not None:
        _checks.tensor("carry.pend", getattr(carry, "pend", None), shape=(S,), dtype=torch.int32,
                       device=conv_state.device)
    if state_indices is None:
        if S < B:
            raise ValueError(f"state_indices: required when conv_state has fewer slots ({S}) than B ({B})")
    else:
        check_indices("state_indices", state_indices, B, S, conv_state.device)
        _checks.host_indices("state_indices", state_indices, S)
        if validate:
            _checks.indices_values("state_indices", state_indices, S, padding=True)
    if validate and carry is not None:
        _checks.nothing_pending("carry.pend", carry.pend, state_indices, B)


def _check_apart(conv_state, intermediate, x, weight, bias, state_indices):
    """The windows written (the state, the snapshots) share no memory with each other or with
    what the launch reads (``_checks.apart``)."""
    _checks.no_overlap("conv_state", conv_state)
    _checks.apart({"conv_state": conv_state, "intermediate": intermediate},
                  {"x": x, "weight": weight, "bias": bias, "state_indices": state_indices})
