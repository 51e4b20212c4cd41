"""Gated DeltaNet decode (SPEC §2) and the K-row chain with snapshots (SPEC §3a): one kernel.

``gdn_rows_kernel`` runs ``K`` rows (tokens) of the recurrence for one (sequence, value head,
column block): it loads the state block ``H[slot, hv, :, cols]`` (``BK x BV`` fp32) into
registers once, applies each row in order through the shared helpers ``qk_prepare`` and
``gdn_row`` (``pmll_lab.ops.gdn.recurrence``), writes each row's output, optionally the state
after each row ``t < K-1`` to the snapshot buffer, and writes the state back once after the last
row. Decode is the same kernel with ``K = 1`` and no snapshots, so a chain of ``K`` rows and ``K``
successive decodes execute the same per-row instructions on the same block shapes
(``block_config``): that is SPEC §2's exactness, checked bitwise by the tests and the notebook.
Up to ``chain_unroll_max_rows`` rows (``pmll_lab.ops.settings``) the row loop is unrolled; longer
chains run a runtime loop, one compiled body for every row (an unrolled 8-row chain was seen 1
ulp off decode in its last row at kd = 64 on an H200). ``gdn_decode_plan`` / ``gdn_chain_plan`` bind a launch once for
host-bound small batches (``pmll_lab.ops.launch``).

Grid: ``(B * HV * NV,)`` with ``NV = cdiv(vd, BV)``; program ``(b * HV + hv) * NV + j`` owns
value columns ``j*BV .. j*BV+BV-1`` of head ``hv`` of sequence ``b`` (a head's blocks on
consecutive programs, ``recurrence.head_tile_program``), and reads key head
``hv // (HV // HK)`` (GVA). Columns of one head are independent in the recurrence (each program
recomputes the row's normalised q, k), so programs never share writes.

Layouts: every input is addressed through its strides (last dim contiguous), so ``q, k, v, g,
beta`` can be views of one fused projection buffer; ``state [S, HV, kd, vd]`` and the snapshots
``[B, K-1, HV, kd, vd]`` likewise (last dim contiguous). Slot and batch offsets use int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.ops.gdn.checks import check_decode_args
from pmll_lab.ops.gdn import decode_cuda
from pmll_lab.ops.gdn.decode_vk import ROW_PTRS, ROW_STRIDES, gdn_rows_vk_kernel
from pmll_lab.ops.gdn.gating import Gating, gate_inputs, split_gating
from pmll_lab.ops import settings
from pmll_lab.ops.gdn.recurrence import (DEFAULT_STATE_LAYOUT, EXACT_LAUNCH, block_config,
                                         gdn_row, head_tile_program, load_gate_params,
                                         kv_state_vector, load_row_inputs, qk_prepare,
                                         round_to_state, state_tile, vk_chunk_meta,
                                         vk_config, vk_qk_aligned)
from pmll_lab.ops.host import cdiv
from pmll_lab.ops.launch import LaunchPlan, device_guard



# The per-row vectors (q, k, v, g, beta, o) and their strides are not specialised on alignment
# or divisibility: the compiler picks the register layout of a loaded vector, and so the order
# of the sums in ``qk_prepare``, from what it knows of the pointer's alignment. Unspecialised,
# the results do not depend on where a view starts in a fused projection buffer, and a decode
# launch on row ``t`` of a view sees what the chain sees (bitwise agreement). They are a few
# hundred bytes per row, so the vector width does not matter for speed. The state and snapshot
# buffers stay specialised (wide loads): bitwise agreement across kernels needs them to be the
# same buffers, or buffers of the same alignment (any torch allocation with kd, vd multiples of
# 16 qualifies). The lists (``ROW_PTRS``, ``ROW_STRIDES``) are ``decode_vk``'s, shared by both
# layouts' kernels.


@triton.jit
def chain_row(h, t, q_row, k_row, v_row, g_row, beta_row, o, inter, b64, hv,
              q_t, k_t, v_t, g_t, beta_t, o_b, o_t, o_h, i_b, i_t, i_h, i_k,
              rk, mk, rv, mv, mh, live, scale, ga, gd, K: tl.constexpr,
              STORE_INTER: tl.constexpr, USE_QK_L2NORM: tl.constexpr, GATE: tl.constexpr,
              STATE_VEC: tl.constexpr):
    """Row ``t`` of ``gdn_rows_kernel``: load, ``qk_prepare``, ``gdn_row``, store ``o`` (and
    the snapshot after the row when ``STORE_INTER`` and ``t < K-1``). Returns the new block.

    The snapshot store takes the state load's ``STATE_VEC`` cap too: Triton lays the whole block
    out for its widest access, so an uncapped 16-byte snapshot store (8 columns of a 2-byte
    state at kd = 16: one key row per thread) would move the chain's sums over keys off
    decode's layout (``pmll_lab.lowering`` compares decode with the chain with snapshots).

    ``h``: the fp32 ``[BK, BV]`` state block (key rows ``rk``, value columns ``rv``, masks
    ``mk``, ``mv``, ``mh``); ``o``/``inter``: the output and snapshot tensors (their dtypes);
    a device function, it raises nothing. Public (a module attribute the kernel looks up when it
    compiles) so tests/cuda/test_lowering.py can swap in an uncapped mutant and see the check fail."""
    qt, kt, vt, gt, bt = load_row_inputs(q_row + t * q_t, k_row + t * k_t, v_row + t * v_t,
                                         g_row + t * g_t, beta_row + t * beta_t, rk, mk, rv, mv,
                                         ga, gd, GATE)
    qt, kt = qk_prepare(qt, kt, scale, USE_QK_L2NORM)
    h, ot, ut = gdn_row(h, qt, kt, vt, gt, bt)
    if K > 1:   # a bf16/fp16 state as a decode would store it (K = 1: the state store rounds)
        h = round_to_state(h, inter)
    tl.store(o + b64 * o_b + t * o_t + hv * o_h + rv,
             tl.where(live, ot, 0.0).to(o.dtype.element_ty), mask=mv)
    if STORE_INTER:
        if t < K - 1:
            p_i = inter + b64 * i_b + t * i_t + hv * i_h + rk[:, None] * i_k + rv[None, :]
            if STATE_VEC > 0:            # the state load's cap: the block keeps decode's layout
                p_i = tl.max_contiguous(p_i, [1, STATE_VEC])
            tl.store(p_i, h, mask=mh)
    return h


@triton.jit(do_not_specialize=ROW_STRIDES, do_not_specialize_on_alignment=ROW_PTRS)
def gdn_rows_kernel(
    state, q, k, v, g, beta, o, inter, slot_idx, out_idx, A_log, dt_bias,
    scale,
    s_slot, s_head, s_key,                 # state strides (value column stride 1)
    q_b, q_t, q_h,                         # q strides (batch, row, head)
    k_b, k_t, k_h,
    v_b, v_t, v_h,
    g_b, g_t,                              # g, beta: head stride 1
    beta_b, beta_t,
    o_b, o_t, o_h,
    i_b, i_t, i_h, i_k,                    # snapshot strides (batch, row, head, key row)
    HV, GROUP,
    KD: tl.constexpr, VD: tl.constexpr,
    K: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_IDX: tl.constexpr, STORE_INTER: tl.constexpr, USE_QK_L2NORM: tl.constexpr,
    UNROLL: tl.constexpr, HAS_OUT_IDX: tl.constexpr, GATE: tl.constexpr,
    STATE_VEC: tl.constexpr = 0,
):
    b64, hv, pid_v = head_tile_program(HV, tl.cdiv(VD, BV))
    hk = hv // GROUP
    if HAS_IDX:
        slot = tl.load(slot_idx + b64).to(tl.int64)
    else:
        slot = b64
    live = slot >= 0                     # slot -1: a padding lane (zero outputs, no state access)
    oslot = slot
    if HAS_OUT_IDX:                      # the final state goes to out_idx[b] (-1: padding too)
        oslot = tl.load(out_idx + b64).to(tl.int64)
        live = live & (oslot >= 0)
        oslot = tl.maximum(oslot, 0)
    slot = tl.maximum(slot, 0)

    rk = tl.arange(0, BK)
    rv = pid_v * BV + tl.arange(0, BV)
    mk = rk < KD
    mv = rv < VD
    mh = mk[:, None] & mv[None, :] & live

    p_h = state + slot * s_slot + hv * s_head + rk[:, None] * s_key + rv[None, :]
    if STATE_VEC > 0:                    # >= 2 key rows per thread (recurrence.kv_state_vector)
        p_h = tl.max_contiguous(p_h, [1, STATE_VEC])
    h = tl.load(p_h, mask=mh, other=0.0)
    if K > 1:                            # rows kept in registers: the tile as the family holds it
        h = state_tile(h)
    else:                                # a decode: one row, widened once (never packed)
        h = h.to(tl.float32)

    q_row = q + b64 * q_b + hk * q_h
    k_row = k + b64 * k_b + hk * k_h
    v_row = v + b64 * v_b + hv * v_h
    g_row = g + b64 * g_b + hv             # with GATE: a and b (gating computed per row)
    beta_row = beta + b64 * beta_b + hv
    ga, gd = load_gate_params(A_log, dt_bias, hv, GATE)
    if UNROLL:
        for t in tl.static_range(K):
            h = chain_row(h, t, q_row, k_row, v_row, g_row, beta_row, o, inter, b64, hv,
                           q_t, k_t, v_t, g_t, beta_t, o_b, o_t, o_h, i_b, i_t, i_h, i_k,
                           rk, mk, rv, mv, mh, live, scale, ga, gd, K, STORE_INTER,
                           USE_QK_L2NORM, GATE, STATE_VEC)
    else:
        for t in range(K):
            h = chain_row(h, t, q_row, k_row, v_row, g_row, beta_row, o, inter, b64, hv,
                           q_t, k_t, v_t, g_t, beta_t, o_b, o_t, o_h, i_b, i_t, i_h, i_k,
                           rk, mk, rv, mv, mh, live, scale, ga, gd, K, STORE_INTER,
                           USE_QK_L2NORM, GATE, STATE_VEC)

    if HAS_OUT_IDX:
        tl.store(p_h + (oslot - slot) * s_slot, h, mask=mh)
    else:
        tl.store(p_h, h, mask=mh)


def _launch_args(state, q, k, v, g, beta, o, intermediate, state_indices, scale, use_qk_l2norm,
                 B, K, HK, HV, kd, vd, *, rows: bool, layout: str = DEFAULT_STATE_LAYOUT,
                 out_state_indices=None, gating: Gating | None = None):
    """``(kernel, grid, args, kwargs)`` of the launch (``B >= 1``): ``gdn_rows_kernel`` on a
    K-major state, ``gdn_rows_vk_kernel`` on a V-major one (same arguments; ``BV`` is then the
    tile's value rows)."""
    extra = {}
    if layout == "vk":
        BK, BV, num_warps = vk_config(kd, vd, B * HV, state_dtype=state.dtype)
        kernel = gdn_rows_vk_kernel
        extra = dict(vk_chunk_meta(BK), QK_ALIGNED=vk_qk_aligned(kd, q, k),
                     AHEAD=settings.vk_ahead_row(B * HV).rows_ahead)
    else:
        BK, BV, num_warps = block_config(kd, vd)
        kernel = gdn_rows_kernel
        extra = dict(STATE_VEC=kv_state_vector(kd, vd, state.element_size()))
    # Strides of the row axis are 0 for decode (no rows axis); every head stride is explicit.
    if rows:
        qs, ks, vs, os_ = q.stride()[:3], k.stride()[:3], v.stride()[:3], o.stride()[:3]
        gs, bs = g.stride()[:2], beta.stride()[:2]
    else:
        qs, ks, vs, os_ = ((t.stride(0), 0, t.stride(1)) for t in (q, k, v, o))
        gs, bs = (g.stride(0), 0), (beta.stride(0), 0)
    store_inter = intermediate is not None and K > 1
    if store_inter:
        ist = intermediate.stride()[:4]
        inter = intermediate
    else:
        ist, inter = (0, 0, 0, 0), state        # never written (STORE_INTER=False)
    has_idx = state_indices is not None
    # one axis, a head's tiles on consecutive programs (recurrence.head_tile_program)
    grid = (B * HV * cdiv(vd, BV),)
    has_out = out_state_indices is not None
    args = (state, q, k, v, g, beta, o, inter, state_indices if has_idx else state,
            out_state_indices if has_out else state,
            gating.A_log if gating is not None else state,
            gating.dt_bias if gating is not None else state,
            float(kd ** -0.5 if scale is None else scale),
            state.stride(0), state.stride(1), state.stride(2),
            *qs, *ks, *vs, *gs, *bs, *os_, *ist,
            HV, HV // HK)
    kwargs = dict(KD=kd, VD=vd, K=K, BK=BK, BV=BV,
                  HAS_IDX=has_idx, STORE_INTER=store_inter, USE_QK_L2NORM=bool(use_qk_l2norm),
                  UNROLL=K <= settings.gdn().chain_unroll_max_rows, HAS_OUT_IDX=has_out,
                  GATE=gating is not None, num_warps=num_warps,
                  **extra, **EXACT_LAUNCH)
    return kernel, grid, args, kwargs


def _launch(state, q, k, v, g, beta, o, intermediate, state_indices, scale, use_qk_l2norm,
            B, K, HK, HV, kd, vd, *, rows: bool, layout: str, out_state_indices=None,
            gating=None):
    if B == 0:
        return
    kernel, grid, args, kwargs = _launch_args(state, q, k, v, g, beta, o, intermediate,
                                              state_indices, scale, use_qk_l2norm, B, K, HK, HV,
                                              kd, vd, rows=rows, layout=layout,
                                              out_state_indices=out_state_indices, gating=gating)
    kernel[grid](*args, **kwargs)


def gdn_decode(state, q, k, v, g=None, beta=None, *, state_indices=None, scale=None,
               use_qk_l2norm=True, out_dtype=None, validate=False,
               state_layout=DEFAULT_STATE_LAYOUT, out_state_indices=None, A_log=None, a=None,
               dt_bias=None, b=None, carry=None, impl="triton"):
    """One Gated DeltaNet decode token per sequence (SPEC §2); updates ``state`` in place.

    Args:
        state: fp32, bf16 or fp16, last dim contiguous: ``[S, HV, vd, kd]`` with
            ``state_layout="vk"`` (value-major, the default; FlashInfer's "pretranspose") or
            ``[S, HV, kd, vd]`` with ``"kv"`` (key-major, FLA's); the slots ``state_indices`` are
            advanced one token, every other slot is left untouched. A bf16/fp16 state (SGLang's
            ``--mamba-ssm-dtype bfloat16``, FlashInfer's bf16-state kernels; half the state bytes)
            is read into fp32, the token computed in fp32, and the new state rounded to the state's
            dtype (nearest even) once, when stored.
        q, k: ``[B, HK, kd]``, fp32/bf16/fp16 (same dtype), last dim contiguous, any other
            strides (views of a fused projection buffer are read in place, never copied).
        v: ``[B, HV, vd]``, q's dtype; value head ``h`` reads key head ``h // (HV // HK)``.
        g: ``[B, HV]`` fp32 log decay (<= 0). beta: ``[B, HV]`` fp32 in [0, 1]. Or, with
            ``g=None, beta=None``, the gating computed in the kernel from ``A_log, dt_bias
            [HV]`` (fp32/bf16/fp16) and ``a, b [B, HV]`` (q's dtype or fp32):
            ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``, bitwise what
            ``gdn_gating`` gives (``pmll_lab.ops.gdn.gating``).
        state_indices: ``[B]`` int32 or int64 slot of each sequence (default ``arange(B)``),
            contiguous.
        scale: query scale (default ``kd ** -0.5``). use_qk_l2norm: l2-normalise q and k
            (eps 1e-6) first.
        out_dtype: ``None`` (v's dtype) or a float dtype (``torch.float32`` for fp32 outputs).
        validate: also check values (device sync; the rule of every launcher: ``pmll_lab._checks``;
            docs/layouts.md, "validate=True"): ``state_indices`` in ``[0, S)`` and distinct, or -1;
            on the lanes that are not padding (a padding lane's rows are never read) ``q, k, v``,
            ``beta`` and the gating inputs finite, ``g <= 0`` (``-inf`` allowed) and ``beta`` in
            ``[0, 1]``; the states read finite; and with ``carry`` that no slot decoded (read,
            or written through ``out_state_indices``) holds pending carry rows. A slot of -1
            marks a padding lane (vLLM's ``PAD_SLOT_ID``): its outputs are zeros and no state is
            read or written for it. Slot tables on the host (a CPU run) are checked always,
            range and distinct (free there); on a GPU a bad slot table is undefined behaviour
            without ``validate``.
        state_layout: ``"vk"`` (default) or ``"kv"``
            (``pmll_lab.ops.gdn.recurrence.STATE_LAYOUTS``). ``"vk"`` runs
            ``gdn_rows_vk_kernel`` (a few value rows per program, tile from ``vk_config``),
            ``"kv"`` the K-major kernel (``block_config``). The default is V-major in every
            GDN launcher, reference and input maker (the faster layout for every GDN kernel
            here, and the ring form's only one), so a call that omits it means the same
            everywhere; a K-major state (FLA, vLLM, the HF cache) must name ``"kv"``, since
            with ``kd == vd`` its shape cannot tell (``docs/layouts.md``).
        out_state_indices: ``None`` (the new state overwrites the read slot) or ``[B]``
            int32/int64, contiguous: the slot each sequence's new state is written to, its read
            slot left as it was (FlashInfer's ``output_state_indices``: prefix-cache forks,
            state copies). A lane may write its own read slot, never one another lane reads
            (that would race); -1 in either index marks a padding lane. ``validate`` also
            checks: entries in ``[0, S)`` and distinct, or -1 exactly where ``state_indices``
            is -1, and no write slot read by another lane.
        carry: ``None`` or the layer's carried-state stash (``pmll_lab.carry.GdnCarry``, or
            anything with ``pend [S]`` int32), for ``validate``'s pending check.
        impl: ``"triton"`` or ``"cuda"``: the CUDA C++ twin (``kernels/gdn_decode.cu``,
            ``pmll_lab.ops.gdn.decode_cuda``) after the same checks; V-major, ``kd <= 256``;
            within the decode's tolerance of the reference, not bitwise the Triton kernel.
            ``RuntimeError`` without a CUDA device.

    **A slot with pending carry rows must not be decoded.** After a carried-state verify
    (``pmll_lab.carry``) the accepted rows of a slot may sit in its stash, counted by
    ``pend[slot] > 0``, not yet folded into the stored state. Decoding such a slot here starts
    from that stored state, which lags the sequence by those rows: the outputs and the new
    state are silently wrong. Fold first (``gdn_carry_flush``, then clear ``pend``), or keep
    verifying with the carry. ``validate=True`` with ``carry`` passed refuses it.

    ``state`` must share no memory with ``q``, ``k``, ``v``, the gates or the slot tables
    (``ValueError`` naming both otherwise: the kernel writes the state while other lanes
    still read those).

    Returns ``o [B, HV, vd]``. Raises ``ValueError`` naming the argument on bad input, before
    launching. Source: SPEC §2; arithmetic order from ``pmll_lab.ops.gdn.recurrence``.
    """
    _checks.impl("gdn_decode", impl)
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    B, K, HK, HV, kd, vd = check_decode_args(
        state, q, k, v, g, beta, state_indices, None, scale, out_dtype, validate, rows=False,
        layout=state_layout, out_state_indices=out_state_indices, gating=gating,
        use_qk_l2norm=use_qk_l2norm, carry=carry)
    if impl == "cuda":
        decode_cuda.check_cuda(state, kd, state_layout)
    o = torch.empty(B, HV, vd, dtype=out_dtype or v.dtype, device=state.device)
    if impl == "cuda":
        return decode_cuda.launch(state, q, k, v, g, beta, o, gating, state_indices,
                                  out_state_indices, scale, use_qk_l2norm, kd)
    with device_guard(state):
        _launch(state, q, k, v, g, beta, o, None, state_indices, scale, use_qk_l2norm,
                B, K, HK, HV, kd, vd, rows=False, layout=state_layout,
                out_state_indices=out_state_indices, gating=gating)
    return o


def gdn_chain(state, q, k, v, g=None, beta=None, *, state_indices=None, intermediate=None,
              scale=None, use_qk_l2norm=True, out_dtype=None, validate=False,
              state_layout=DEFAULT_STATE_LAYOUT, out_state_indices=None, A_log=None, a=None,
              dt_bias=None, b=None, carry=None, impl="triton"):
    """Verify ``K`` draft rows per sequence with the chain-with-snapshots (SPEC §3a).

    Runs ``K`` tokens of the decode recurrence per sequence in one launch (the state block stays
    in registers between rows), leaves each addressed slot of ``state`` at the state after the
    last row and, when ``intermediate`` is given, writes the state after each row ``t < K-1``
    to ``intermediate[:, t]`` (after accepting ``a`` rows the caller keeps snapshot ``a-1``, or
    ``state`` itself when ``a == K``). Bitwise equal to ``K`` successive ``gdn_decode`` launches
    on the same device: outputs, final state and every snapshot. A padding lane (slot -1) has
    zero outputs and writes nothing: its rows of ``intermediate`` keep what they held.

    Args: as ``gdn_decode`` with a rows axis after ``B``: ``q, k [B, K, HK, kd]``,
    ``v [B, K, HV, vd]``, ``g, beta [B, K, HV]`` (or ``A_log, dt_bias [HV]`` and
    ``a, b [B, K, HV]``: the gating in the kernel), ``1 <= K <= 8``;
    ``intermediate``: ``None`` or ``[B, K-1, *state.shape[1:]]`` in the state's dtype (last dim
    contiguous; snapshots in the state's layout). With a bf16/fp16 state the chain rounds the
    state it keeps in registers to the state's dtype after every row, where ``K`` decodes
    store it, so it stays bitwise equal to them (V-major: when the decodes' q/k rows are
    aligned alike, ``recurrence.vk_qk_aligned``); ``state_layout`` and ``out_state_indices`` (the state
    after the last row goes there, the read slots keep theirs) as in ``gdn_decode``;
    ``carry`` as in ``gdn_decode`` (a slot with pending carry rows must not run a chain
    either). ``intermediate`` and ``state`` must share no memory with each other nor with
    the row inputs and slot tables (``ValueError`` naming both).
    ``impl``: ``"triton"`` or ``"cuda"``: the CUDA C++ twin (``kernels/gdn_chain.cu``,
    ``pmll_lab.ops.gdn.decode_cuda``) after the same checks; V-major, ``kd <= 256``; bitwise
    ``K`` successive ``gdn_decode(impl="cuda")`` launches, within the chain's tolerance of the
    reference, not bitwise the Triton chain. ``RuntimeError`` without a CUDA device.

    Returns ``o [B, K, HV, vd]``. Raises ``ValueError`` naming the argument on bad input, before
    launching. Source: SPEC §3a, the seed's ``gdn_exact_chain`` batched over sequences.
    """
    _checks.impl("gdn_chain", impl)
    g, beta, gating = split_gating(g, beta, A_log, a, dt_bias, b)
    B, K, HK, HV, kd, vd = check_decode_args(
        state, q, k, v, g, beta, state_indices, intermediate, scale, out_dtype, validate, rows=True,
        layout=state_layout, out_state_indices=out_state_indices, gating=gating,
        use_qk_l2norm=use_qk_l2norm, carry=carry)
    if impl == "cuda":
        decode_cuda.check_cuda(state, kd, state_layout, "chain")
    o = torch.empty(B, K, HV, vd, dtype=out_dtype or v.dtype, device=state.device)
    if impl == "cuda":
        return decode_cuda.launch_chain(state, q, k, v, g, beta, o, intermediate, gating,
                                        state_indices, out_state_indices, scale, use_qk_l2norm,
                                        kd)
    with device_guard(state):
        _launch(state, q, k, v, g, beta, o, intermediate, state_indices, scale, use_qk_l2norm,
                B, K, HK, HV, kd, vd, rows=True, layout=state_layout,
                out_state_indices=out_state_indices, gating=gating)
    return o


def gdn_decode_plan(state, q, k, v, g=None, beta=None, *, state_indices=None, scale=None,
                    use_qk_l2norm=True, out_dtype=None, out=None, validate=False,
                    state_layout=DEFAULT_STATE_LAYOUT, out_state_indices=None, A_log=None,
                    a=None, dt_bias=None, b=None, carry=None, impl="triton") -> LaunchPlan:
    """``gdn_decode`` bound to these buffers, for host-bound small batches (B=1).

    Checks the arguments once, as ``gdn_decode`` does (``validate`` checks the values now, at
    plan time only), and returns a ``pmll_lab.ops.launch.LaunchPlan``: ``plan()`` runs one decode
    token on whatever the tensors hold at that moment and returns ``o [B, HV, vd]`` (dtype
    ``out_dtype`` or v's). ``o`` is the same tensor on every call, overwritten by the next one:
    read or copy it first. ``out``: ``None`` (allocated once here) or that tensor, contiguous,
    sharing no memory with the state or an input.
    After the first call on a GPU, calls go straight to the compiled kernel (no checks,
    allocations or argument binding). Write each step's inputs into the same tensors
    (``q.copy_(...)``, or project into them): a plan keeps reading the tensors it was made with,
    so rebinding a name (``q = new``) is silently ignored; make a new plan instead.
    The launch settings (``pmll_lab.ops.settings``) are read when the plan is made. Same
    results, bit for bit, as ``gdn_decode`` on the same values. ``impl``: ``"triton"`` only (a
    plan has no CUDA twin). Raises ``ValueError`` naming the argument.
    """
    _checks.impl("gdn_decode_plan", impl)
    return _plan(state, q, k, v, g, beta, state_indices, None, scale, use_qk_l2norm, out_dtype,
                 out, validate, rows=False, layout=state_layout,
                 out_state_indices=out_state_indices, gating=(A_log, a, dt_bias, b),
                 carry=carry)


def gdn_chain_plan(state, q, k, v, g=None, beta=None, *, state_indices=None,
                   intermediate=None, scale=None, use_qk_l2norm=True, out_dtype=None, out=None,
                   validate=False, state_layout=DEFAULT_STATE_LAYOUT,
                   out_state_indices=None, A_log=None, a=None, dt_bias=None,
                   b=None, carry=None, impl="triton") -> LaunchPlan:
    """``gdn_chain`` bound to these buffers (as ``gdn_decode_plan``; ``intermediate`` is bound
    too); ``plan()`` returns ``o [B, K, HV, vd]``, the same tensor every call (``out``: ``None``
    or that tensor). ``impl``: ``"triton"`` only. Raises ``ValueError`` naming the argument."""
    _checks.impl("gdn_chain_plan", impl)
    return _plan(state, q, k, v, g, beta, state_indices, intermediate, scale, use_qk_l2norm,
                 out_dtype, out, validate, rows=True, layout=state_layout,
                 out_state_indices=out_state_indices, gating=(A_log, a, dt_bias, b),
                 carry=carry)


def _plan(state, q, k, v, g, beta, state_indices, intermediate, scale, use_qk_l2norm, out_dtype,
          out, validate, *, rows: bool, layout: str, out_state_indices=None,
          gating=(None, None, None, None), carry=None) -> LaunchPlan:
    """Check once, take or allocate ``o`` (``out``, checked), bind the launch."""
    g, beta, gating = split_gating(g, beta, *gating)
    B, K, HK, HV, kd, vd = check_decode_args(
        state, q, k, v, g, beta, state_indices, intermediate, scale, out_dtype, validate, rows=rows,
        layout=layout, out_state_indices=out_state_indices, gating=gating,
        use_qk_l2norm=use_qk_l2norm, carry=carry)
    shape = (B, K, HV, vd) if rows else (B, HV, vd)
    dtype = out_dtype or v.dtype
    if out is None:
        o = torch.empty(shape, dtype=dtype, device=state.device)
    else:
        _checks.tensor("out", out, shape=shape, dtype=dtype, contiguous=True)
        _checks.same_device("state", state, out=out)
        _checks.apart({"out": out, "state": state, "intermediate": intermediate},
                      {"q": q, "k": k, "v": v, **gate_inputs(g, beta, gating),
                       "state_indices": state_indices, "out_state_indices": out_state_indices})
        o = out
    if B == 0:
        return LaunchPlan(None, (1,), (), {}, outputs=o)
    kernel, grid, args, kwargs = _launch_args(state, q, k, v, g, beta, o, intermediate,
                                              state_indices, scale, use_qk_l2norm, B, K, HK, HV,
                                              kd, vd, rows=rows, layout=layout,
                                              out_state_indices=out_state_indices,
                                              gating=gating)
    return LaunchPlan(kernel, grid, args, kwargs, outputs=o, device=state.device)
