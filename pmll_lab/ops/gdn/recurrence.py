"""The Gated DeltaNet per-row recurrence, shared by every GDN kernel (SPEC §2).

Decode, the K-row chain, the carried-state verify (exact form) and the carry fold/flush all call
these ``@triton.jit`` helpers on the same block shapes (``block_config``), so their results
agree to the bit: that is what makes speculative verify return exactly the tokens of plain
decoding (SPEC §2 "Exactness"). Change the arithmetic here, and only here.

Arithmetic (ours to choose, SPEC §2; equal to the spec's order up to rounding):
for one value head, a state block ``h [BK, BV]`` (key rows x value columns, fp32),
normalised key ``k [BK]``, scaled query ``q [BK]``, value block ``v [BV]``, log decay ``g``
and ``beta``::

    e  = exp(g)
    hk = h^T k,  hq = h^T q          # both reductions read the *old* state in one pass
    u  = beta * (v - e * hk)         # the delta-rule correction (the stash's ``u_t``)
    o  = e * hq + (k . q) * u        # == (e*h + k u^T)^T q
    h  = fold_row(h, e, k, u)        # h * e + k u^T

``fold_row`` is exactly the state update, so replaying stashed ``(g_t, k_t, u_t)`` rows
reproduces the chain's states bit for bit (SPEC §3b).

Multiply-adds: every GDN kernel launches with ``EXACT_LAUNCH`` (no contraction by
the compiler), so each ``a * b + c`` above is a multiply and an add, rounded twice, in every
kernel alike, and the only fused multiply-adds are the ones written out: ``u = beta *
fma(-e, hk, v)``, the V-major fold (``fold_row_vk``) and, on a GPU, the products of the
key sums ``hk``, ``hq`` (``dot_fma``, ``FMA_SUMS``). Left to the compiler, LLVM contracts
an expression into an FMA or not per copy of it, and which product it fuses depends on the code
around it: seen on an H200 as decode's ``u`` fused in one register layout and unfused in
another (2026-11-29), the V-major flush contracting ``h*e + u*k`` the other way from decode
(2026-11-30), and, with contraction on, tiny heads (kd = 16) where the carry's outputs or its
flushed states differ from decode's in the last bit (fp32 inputs, V-major; bf16 inputs,
K-major), while the sweep shapes agreed (reports/perf-notes.md, "Exactness on the GPU"). The
interpreter computes ``tl.fma`` unfused and contracts nothing, consistently in every kernel.

Every lane must hold the same sum: ``dot_fma``'s combine is not commutative on two raw
products, so a block laid out one key row per thread (the first combine across lanes) leaves
each lane its own rounding of ``hk``, and a stashed ``u`` (one lane's) then does not replay the
other lanes' rows. The K-major kernels load the state block (and the chain stores its
snapshots) at most ``kv_state_vector`` columns per thread so that never happens (kd = 16 with a
2-byte state was the one case).

Same block shapes are necessary, not sufficient: on a GPU the compiler picks the register
layout of a loaded block (and so the order of the sums above) from what it knows of the
pointer's alignment and strides (Triton specialises pointers on 16-byte alignment and integer
arguments on divisibility by 16). Seen on an H200 (2026-11-29, tests/gdn/test_gdn.py): a state read
through a misaligned strided view gave results that differ in the last bits from the same
values in a contiguous buffer. So kernels that must agree bitwise should (a) read the state from
the same buffers, or buffers of the same alignment, and (b) not specialise the small per-row
vectors (q, k, v, g, beta, outputs) and their strides
(``do_not_specialize`` / ``do_not_specialize_on_alignment``), as
``pmll_lab.ops.gdn.decode.gdn_rows_kernel`` does, so that where a view starts in a fused
projection buffer cannot change the bits.
"""

from __future__ import annotations

from functools import lru_cache

import triton
import triton.language as tl

from pmll_lab.backend import INTERPRET
from pmll_lab.ops import settings
from pmll_lab.ops.host import next_power_of_2

PACKED_STATE_TILE = tl.constexpr(settings.gdn().packed_state_tile)
"""The ``packed_state_tile`` setting of ``pmll_lab.ops.settings``, fixed at import (a global of
the jitted ``round_to_state`` / ``state_tile``): a 2-byte state tile held as 2-byte pairs
between rows (half the registers) or widened to fp32. Same bits either way."""


PAIRED_ROUNDING = tl.constexpr(not INTERPRET)
"""On a GPU ``round_to_state`` rounds two fp32 values per conversion (PTX ``cvt.rn.bf16x2.f32`` /
``cvt.rn.f16x2.f32``, SASS ``F2FP``) instead of one (``F2F``), and ``state_f32`` widens a bf16
pair with one shift and one mask: fewer issue slots; both round to nearest even, so the bits are
the same. The interpreter has no inline PTX and casts.
The paired form needs an even element count per thread (every state tile has one; a tensor of
one element does not compile)."""

EXACT_LAUNCH = {"enable_fp_fusion": False}
"""Launch options of every GDN kernel: decode, the chain, the carried-state verify (exact form),
the flush and the gating kernel. The compiler contracts no multiply-add on its own, so a result's rounding depends on the expression alone, not on the
kernel around it (see the module docstring). Checked on an NVIDIA H200, 2026-11-30
(reports/perf-notes.md, "Exactness on the GPU"): with it the exact family's GPU tests pass
bitwise at every shape they try, the tiny-head ones included, which with contraction on fail;
it costs decode 0.8 % and the 4-row chain 0.9 % at B = 64 (HK=16, HV=32, kd=vd=128), the V-major lazy exact verify 6 %. The
interpreter ignores it."""

STATE_LAYOUTS = ("kv", "vk")
"""State layouts of the GDN family (SPEC §2 "Serving conventions"): ``"kv"`` stores a head's
state key-major, ``[S, HV, kd, vd]`` (FLA, vLLM); ``"vk"`` value-major, ``[S, HV, vd, kd]``
(FlashInfer, SGLang "pretranspose"). Both hold the same ``H``; exactness holds within one."""

DEFAULT_STATE_LAYOUT = settings.gdn().default_state_layout
"""The layout every GDN launcher, reference, input maker and state holder takes when
``state_layout`` is not given: ``"vk"``, V-major (the faster layout for every GDN kernel here,
FlashInfer's and SGLang's, and the only one of the ring form and the CUDA twins; why and the
rules for K-major states: ``docs/layouts.md``, ``pmll_lab.ops.settings``)."""


def check_layout(name: str, layout) -> str:
    """``layout`` if it is one of ``STATE_LAYOUTS``; ``ValueError`` naming ``name`` otherwise."""
    if layout not in STATE_LAYOUTS:
        raise ValueError(f"{name}: expected one of {STATE_LAYOUTS}, got {layout!r}")
    return layout


def head_dims(shape, layout: str) -> tuple[int, int]:
    """``(kd, vd)`` of a state whose last two dims are ``shape[-2:]`` in ``layout``."""
    a, b = shape[-2], shape[-1]
    return (a, b) if layout == "kv" else (b, a)


L2NORM_EPS = 1e-6
"""eps inside ``x * rsqrt(sum(x*x) + eps)`` for q/k l2norm (SPEC §2; FLA and Qwen3-Next use 1e-6)."""


SOFTPLUS_THRESHOLD = 20.0
"""``softplus(x) = x`` above this (PyTorch's ``F.softplus`` default, which Qwen3-Next, FLA and
FlashInfer use for the gate)."""


@triton.jit
def gdn_gate_g(A_log, a, dt_bias):
    """Log decay from Qwen3-Next's gating inputs (fp32): ``-exp(A_log) * softplus(a + dt_bias)``,
    softplus with PyTorch's threshold 20. ``log1p(y)`` for ``y = exp(x)`` is written as
    ``log(1 + y) * y / ((1 + y) - 1)`` (``y`` where ``1 + y`` rounds to 1; Goldberg's
    compensation, ``tl`` has no ``log1p`` the interpreter runs), so a very negative ``x``
    keeps a relative accuracy of a few ulp instead of flushing the decay to 0."""
    x = a + dt_bias
    y = tl.exp(x)
    u = 1.0 + y
    sp = tl.where(u == 1.0, y, tl.log(u) * (y / (u - 1.0)))
    sp = tl.where(x > 20.0, x, sp)
    return -tl.exp(A_log) * sp


@triton.jit
def gdn_gate_beta(b):
    """``sigmoid(b) = 1 / (1 + exp(-b))`` (fp32)."""
    return 1.0 / (1.0 + tl.exp(-b))


@triton.jit
def gdn_gate(A_log, a, dt_bias, b):
    """``(g, beta)`` of Qwen3-Next's gating (SPEC §2 "Gating"), elementwise on fp32 values:
    the one definition that ``pmll_lab.gdn.gdn_gating`` and every kernel with the gating fused
    in compute, so both give the same bits. Source: Qwen3-Next (HF transformers
    ``Qwen3NextGatedDeltaNet``), FLA and FlashInfer's fused gates."""
    return gdn_gate_g(A_log, a, dt_bias), gdn_gate_beta(b)


@triton.jit
def head_tile_program(HV, NT: tl.constexpr):
    """``(b, hv, j)`` of this program on a grid of ``B * HV * NT`` programs, ``b`` as int64,
    the tile ``j`` fastest: consecutive programs walk one head's state, not one tile of
    successive heads (a whole head apart). Every GDN kernel that splits a head's state across
    programs (decode, the chain, the exact verify, the flush; both layouts) orders them
    so. Why: the programs resident at a time then stream a few whole heads, which the H200
    measured faster in both layouts (reports/perf-notes-archive.md v15, v16)."""
    pid = tl.program_id(0)
    bh = pid // NT
    return (bh // HV).to(tl.int64), bh % HV, pid % NT


@triton.jit
def load_gate_params(alog_ptr, dtb_ptr, hv, GATE: tl.constexpr):
    """``(A_log[hv], dt_bias[hv])`` as fp32 when the gating is fused (``GATE``), else zeros
    (unused)."""
    ga = 0.0
    gd = 0.0
    if GATE:
        ga = tl.load(alog_ptr + hv).to(tl.float32)
        gd = tl.load(dtb_ptr + hv).to(tl.float32)
    return ga, gd


@triton.jit
def qk_prepare(q, k, scale, USE_QK_L2NORM: tl.constexpr):
    """fp32 ``q, k [BK]`` (padding lanes zero) -> (scaled, normalised q; normalised k)."""
    if USE_QK_L2NORM:
        q = q * tl.math.rsqrt(tl.sum(q * q, 0) + 1e-6)
        k = k * tl.math.rsqrt(tl.sum(k * k, 0) + 1e-6)
    q = q * scale
    return q, k


@triton.jit
def fold_row(h, e, k, u):
    """State update with a known row: ``h * e + k u^T`` (``h [BK, BV]`` in the state's type,
    ``state_f32``; ``e`` = exp(g)); fp32."""
    return state_f32(h) * e + k[:, None] * u[None, :]


@triton.jit
def round_to_state(h, state_ptr):
    """``h`` (fp32) rounded to the element type of ``state_ptr`` (round to nearest even): the
    value a bf16 or fp16 state pool stores after a token, so a kernel that keeps the state in
    registers across rows (chain, carry verify, folds) rounds where successive decodes store it.
    Held as the kernels hold a tile between rows (``state_tile``): in the state's type with
    ``PACKED_STATE_TILE`` (stored as it is: write-back, snapshot, flush), else widened back to
    fp32. The row functions (``gdn_row``, ``fold_row`` and their ``_vk`` twins) take either
    (``state_f32``). A no-op for an fp32 state. On a GPU the rounding is paired
    (``PAIRED_ROUNDING``; reports/perf-notes.md, "bf16 state pools")."""
    if state_ptr.dtype.element_ty == tl.bfloat16:
        if PAIRED_ROUNDING:
            if PACKED_STATE_TILE:
                # two elements per instance: $0 out (the pair, first element in the low
                # half, as a bf16x2 load or store lays it), $1, $2 in
                h = tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [h],
                                              dtype=tl.bfloat16, is_pure=True, pack=2)
            else:
                # $0, $1 out (bf16 bits in the high half), $2, $3 in
                h = tl.inline_asm_elementwise(
                    "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; "
                    "and.b32 $1, t, 0xffff0000; }",
                    "=r,=r,f,f", [h], dtype=tl.uint32, is_pure=True,
                    pack=2).to(tl.float32, bitcast=True)
        else:
            h = state_tile(h.to(tl.bfloat16))
    elif state_ptr.dtype.element_ty == tl.float16:
        if PAIRED_ROUNDING:
            if PACKED_STATE_TILE:
                h = tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [h],
                                              dtype=tl.float16, is_pure=True, pack=2)
            else:
                h = tl.inline_asm_elementwise(
                    "{ .reg .b32 t; .reg .b16 a, b; cvt.rn.f16x2.f32 t, $3, $2; "
                    "mov.b32 {a, b}, t; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }",
                    "=f,=f,f,f", [h], dtype=tl.float32, is_pure=True, pack=2)
        else:
            h = state_tile(h.to(tl.float16))
    return h


@triton.jit
def state_tile(h):
    """A state tile loaded from the pool, as the exact family holds it between rows: as loaded
    with ``PACKED_STATE_TILE`` (a 2-byte state stays 2 bytes), else widened to fp32."""
    if not PACKED_STATE_TILE:
        h = h.to(tl.float32)
    return h


@triton.jit
def state_f32(h):
    """A state tile as fp32 (exact): ``h`` as loaded from the pool or returned by
    ``round_to_state`` (fp32, bf16 or fp16). On a GPU a bf16 pair widens with one shift and one
    mask (``PAIRED_ROUNDING``) where Triton's cast takes a byte permute and a shift per value."""
    if h.dtype == tl.bfloat16:
        if PAIRED_ROUNDING:
            # $2: the pair (first element in the low half); $0, $1 out
            h = tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }",
                                          "=r,=r,r", [h], dtype=tl.uint32, is_pure=True,
                                          pack=2).to(tl.float32, bitcast=True)
    return h.to(tl.float32)


@triton.jit
def load_gates(g_row, beta_row, ga, gd, GATE: tl.constexpr):
    """A row's ``g, beta`` as fp32 scalars: loaded, or with ``GATE`` computed by ``gdn_gate``
    from ``a, b`` (which ``g_row``, ``beta_row`` then point at) and ``A_log``, ``dt_bias``
    (``ga``, ``gd`` from ``load_gate_params``)."""
    return row_gates(tl.load(g_row), tl.load(beta_row), ga, gd, GATE)


@triton.jit
def row_gates(g, beta, ga, gd, GATE: tl.constexpr):
    """A row's loaded ``g, beta`` (or, with ``GATE``, ``a, b``) as the fp32 ``g, beta`` the
    recurrence takes (``load_gates``; the V-major kernels call it on rows loaded ahead)."""
    g = g.to(tl.float32)
    beta = beta.to(tl.float32)
    if GATE:
        g, beta = gdn_gate(ga, g, gd, beta)
    return g, beta


@triton.jit
def load_row_inputs(q_row, k_row, v_row, g_row, beta_row, rk, mk, rv, mv, ga, gd,
                    GATE: tl.constexpr):
    """One row's inputs as fp32: ``q, k [BK]`` (padding lanes 0), ``v [BV]``, scalars ``g``,
    ``beta`` (``load_gates``), from pointers to the row's key head (q, k), value head (v) and
    gates."""
    q = tl.load(q_row + rk, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_row + rk, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(v_row + rv, mask=mv, other=0.0).to(tl.float32)
    g, beta = load_gates(g_row, beta_row, ga, gd, GATE)
    return q, k, v, g, beta


FMA_SUMS = tl.constexpr(settings.gdn().fma_sums)
"""``dot_fma`` fuses its products: ``fma_sums`` of ``pmll_lab.ops.settings``, fixed at import (a
global of a jitted function); ``PMLL_LAB_FMA_SUMS=0`` / ``1`` switches it. Either way every
kernel of a process rounds alike."""


@triton.jit
def _fma_pair(a, b, c, d):
    """Combine of ``dot_fma``: each of ``(a, b)``, ``(c, d)`` is a product's two factors or a
    partial sum and 1.0; returns ``(fma(c, d, a * b), 1.0)`` (``x * 1.0`` is exact)."""
    return tl.fma(c, d, a * b), 1.0


@triton.jit
def dot_fma(x, y, axis: tl.constexpr):
    """``sum(x * y, axis)`` with every product that meets a partial sum added to it by a fused
    multiply-add, in the order ``tl.sum`` would add (fp32; ``y`` broadcast to ``x``'s shape).

    Why: the exact family launches without compiler contraction (``EXACT_LAUNCH``), which
    made each product of a key sum a multiply plus an add; written out, the FMAs come back
    while every kernel still rounds alike (the same ``tl.reduce`` order on the same layout).
    Across threads the partial sums meet as plain adds. sm_90 instruction counts and H200
    times: reports/perf-notes-archive.md v13."""
    if x.shape[axis] == 1 or not FMA_SUMS:   # one element: no combine runs; or switched off
        return tl.sum(x * y, axis)
    s, _ = tl.reduce((x, tl.broadcast_to(y, x.shape)), axis, _fma_pair)
    return s


@triton.jit
def gdn_row(h, q, k, v, g, beta):
    """One token of the recurrence on a state block. Returns ``(h_new, o [BV], u [BV])``.

    ``h [BK, BV]`` fp32, or bf16 / fp16 as a 2-byte pool holds it (``state_f32``; ``h_new`` is
    fp32); ``q, k [BK]`` fp32 as returned by ``qk_prepare``; ``v [BV]`` fp32;
    ``g`` (log decay), ``beta`` fp32 scalars.
    """
    e = tl.exp(g)
    h = state_f32(h)
    hk = dot_fma(h, k[:, None], 0)
    hq = dot_fma(h, q[:, None], 0)
    u = beta * tl.fma(-e, hk, v)
    o = e * hq + tl.sum(k * q, 0) * u
    h = fold_row(h, e, k, u)
    return h, o, u


# ---- V-major state ("vk": [S, HV, vd, kd]) ---------------------------------------------------
# The same recurrence on a tile of value rows x keys (each value row's keys contiguous,
# FlashInfer's "pretranspose" layout). A value row's update depends on that row alone, so a
# program holds a few rows (little state per thread, many programs resident). The tile is held
# as ``h [BR, NC, CW]``: the key axis split into ``NC`` chunks of ``CW`` (<= 32) keys. Triton
# spreads a warp's threads over the contiguous chunk width (8 threads of 4 keys) and then over
# value rows (4), and keeps the chunks in each thread's registers, so a sum over keys is
# register adds over chunks and keys plus a 3-step shuffle tree, against a 5-step tree for
# every value row with a flat ``[BR, BK]`` tile (reports/perf-notes-archive.md v11). Decode,
# the chain, the exact carry and its folds call these; ``q``, ``k`` and stash key rows are
# ``[NC, CW]``.


@triton.jit
def vk_dot_keys(h, k):
    """``sum_keys(h * k)`` for a tile ``h [BR, NC, CW]`` and keys ``k [NC, CW]``: over the
    chunks with FMAs (``dot_fma``; a thread holds every chunk of its keys), then over the chunk
    width: ``[BR]``."""
    return tl.sum(dot_fma(h, k[None, :, :], 1), 1)


@triton.jit
def qk_prepare_vk(q, k, scale, USE_QK_L2NORM: tl.constexpr):
    """``qk_prepare`` for chunked ``q, k [NC, CW]`` fp32 (padding lanes zero)."""
    if USE_QK_L2NORM:
        q = q * tl.math.rsqrt(tl.sum(tl.sum(q * q, 1), 0) + 1e-6)
        k = k * tl.math.rsqrt(tl.sum(tl.sum(k * k, 1), 0) + 1e-6)
    q = q * scale
    return q, k


@triton.jit
def fold_row_vk(h, e, k, u):
    """State update with a known row on a V-major tile ``h [BR, NC, CW]`` (state's type, fp32
    out):
    ``tl.fma(u k^T, 1, h * e)``, the FMA written out. Left to the compiler,
    ``h * e + u * k`` was contracted one way in decode and another in the flush kernel, whose
    folded states then differed from decode's in the last bit (H200, 2026-11-30,
    reports/perf-notes-archive.md v11)."""
    return tl.fma(u[:, None, None], k[None, :, :], state_f32(h) * e)


@triton.jit
def gdn_row_vk(h, q, k, v, g, beta):
    """One token of the recurrence on a V-major tile. Returns ``(h_new, o [BR], u [BR])``.

    ``h [BR, NC, CW]`` (value rows x key chunks x chunk width) in the state's type, as
    ``gdn_row`` takes it; ``q, k [NC, CW]`` fp32
    from ``qk_prepare_vk``; ``v [BR]`` fp32 (this tile's value rows); ``g``, ``beta`` fp32
    scalars. Same arithmetic as ``gdn_row`` with the state transposed.
    """
    e = tl.exp(g)
    h = state_f32(h)
    hk = vk_dot_keys(h, k)
    hq = vk_dot_keys(h, q)
    u = beta * tl.fma(-e, hk, v)
    o = e * hq + tl.sum(tl.sum(k * q, 1), 0) * u
    h = fold_row_vk(h, e, k, u)
    return h, o, u


def vk_config(k_dim: int, v_dim: int, work: int, kind: str = "rows", *,
              state_dtype) -> tuple[int, int, int]:
    """``(BK, BR, num_warps)`` of the V-major family for a head of ``k_dim x v_dim``, ``work =
    B * HV`` (sequences x value heads) and a state pool of ``state_dtype`` (a ``torch.dtype``
    or its name, one of ``settings.STATE_DTYPES``). ``kind``: ``"rows"`` (decode, the chain)
    or ``"carry"`` (the carried-state verify and flush). ``BK`` covers the whole key dim
    (padded to a power of two), ``BR`` value rows per program from the ``vk_tiles`` setting's
    row (``pmll_lab.ops.settings.vk_tiles_row``; for ``"rows"`` on a 2-byte state from
    ``vk_rows_half`` when ``32 <= BK <= 128``; at most ``v_dim`` padded, and at most
    ``8192 // BK`` so a one-warp tile stays <= 64 fp32 per thread). The key axis is held in
    ``vk_chunks(BK)`` chunks. Every shipped tile is one warp with its threads over 4 value rows
    x 8 key lanes, so the per-row sums run in one order whatever the tile's row count: decode,
    the chain, the exact carry and the flush agree to the bit. Why ``32 <= BK <= 128``: a
    16-key tile of 16 rows would give each thread 8 keys of a 2-byte state
    (``vk_state_vector``), another reduction order; 256 keys were not measured (twice the
    registers). Raises ``ValueError`` for an unknown ``kind``, or naming ``state_dtype`` for
    a dtype the tables have no rows for (a float8 state takes no other dtype's tile)."""
    if kind not in ("rows", "carry"):
        raise ValueError(f"kind: expected 'rows' or 'carry', got {kind!r}")
    half = settings.state_bytes(state_dtype) == 2
    bk = next_power_of_2(k_dim)
    tile = settings.vk_tiles_row(work)
    br = tile.value_rows if kind == "rows" else tile.carry_value_rows
    if kind == "rows" and half and 32 <= bk <= 128:
        br = settings.vk_rows_half_row(work).value_rows
    br = max(1, min(br, next_power_of_2(v_dim), max(1, 8192 // bk)))
    return bk, br, tile.num_warps


def vk_qk_aligned(k_dim: int, q, k) -> bool:
    """``QK_ALIGNED`` of a V-major launch (``decode_vk.load_key_row_vk``): True when ``k_dim``
    keys span a multiple of 16 bytes and every q and k row (``[..., k_dim]``, unit key stride)
    starts on 16 bytes, i.e. each tensor's ``data_ptr`` and the strides (in bytes) of its
    leading dims longer than 1 are multiples of 16. Fresh contiguous tensors with such a
    ``k_dim``, and views of a fused projection whose q/k columns and row strides fall on 16
    bytes, qualify; then each thread loads its keys as one vector. Otherwise (SPEC §2: views
    are read in place, never copied) the kernel loads one key per thread, on another register
    layout, so its l2norm and ``k.q`` sums may round differently on a GPU. So decode, the chain
    and the carry agree bitwise between launches with equal ``QK_ALIGNED``: always for
    fresh contiguous inputs and for the usual fused buffers; a view whose row stride is off 16
    bytes can give a chain ``False`` and some of its row slices ``True`` (the interpreter has no
    layouts and agrees always). False whenever the ``vk_qk_hint`` setting is off."""
    if not settings.gdn().vk_qk_hint:
        return False

    def rows_aligned(t) -> bool:
        size = t.element_size()
        return (vk_qk_rows_fit(k_dim, size) and t.data_ptr() % 16 == 0
                and all(st * size % 16 == 0 for st, n in zip(t.stride()[:-1], t.shape[:-1])
                        if n > 1))
    return rows_aligned(q) and rows_aligned(k)


def vk_qk_rows_fit(k_dim: int, itemsize: int) -> bool:
    """The head-size half of ``vk_qk_aligned``: ``k_dim`` keys of ``itemsize`` bytes span a
    multiple of 16 bytes (what ``pmll_lab.lowering`` assumes of contiguous q/k rows)."""
    return (k_dim * itemsize) % 16 == 0


def vk_chunks(block_k: int) -> tuple[int, int]:
    """``(NC, CW)``: a key block of ``block_k`` (a power of two) as ``NC`` chunks of ``CW``."""
    cw = min(block_k, settings.gdn().vk_chunk)
    return block_k // cw, cw


def vk_chunk_meta(block_k: int) -> dict[str, int]:
    """``vk_chunks(block_k)`` as the V-major kernels' constexprs: ``{"NC": NC, "CW": CW}``
    (ints) for a key block of ``block_k`` (a power of two). One spelling for every V-major
    launch (decode, the carry's verify and flush, ``pmll_lab.lowering``), so their key chunks,
    and so their sums' order, cannot drift apart."""
    return dict(zip(("NC", "CW"), vk_chunks(block_k)))


def vk_state_vector(k_dim: int, v_dim: int, work: int, state_dtype) -> int:
    """Contiguous keys per thread in which decode's V-major tile (``vk_config`` for ``work =
    B * HV`` and a state pool of ``state_dtype``) lies in registers: a 16-byte vector of the
    state's elements, at most a key chunk, and at most the tile's share per thread (Triton's
    coalescing rule for a load of ``BR x BK`` elements on ``32 * warps`` threads). The exact
    carry verify loads its tile (which may hold more value rows, ``vk_tiles``'
    ``carry_value_rows``) with at most this many (``STATE_VEC``), so its sums over keys run on
    decode's thread layout. Why: a 2-byte state at ``kd = 16`` gave decode's 8-row tile 4 keys
    per thread and the carry's 16-row tile 8, another reduction order
    (``pmll_lab.lowering``). Raises ``ValueError`` naming ``state_dtype`` for a dtype other
    than ``settings.STATE_DTYPES``' (float32, bfloat16, float16)."""
    size = settings.state_bytes(state_dtype)
    bk, br, warps = vk_config(k_dim, v_dim, work, state_dtype=state_dtype)
    return max(1, min(16 // size, vk_chunks(bk)[1], br * bk // (32 * warps)))


def kv_state_vector(k_dim: int, v_dim: int, state_itemsize: int) -> int:
    """``STATE_VEC`` of the K-major exact kernels (decode, the chain, the exact carry verify):
    the most contiguous value columns per thread the state block (``block_config``) may be
    loaded with so that each thread holds at least two key rows of it, or 0 when the natural
    16-byte vector already leaves two (no hint: the launch as it always was).

    Why: ``dot_fma``'s combine ``fma(c, d, a * b)`` is not commutative on two raw products,
    and a warp reduces by butterfly shuffles in which each lane combines its own value with
    its partner's, so when a thread holds a single key row (the first combine runs across
    lanes) the lanes end with different key sums ``h^T k``: each key row of the state is then
    updated with its own lane's ``u``, while the stash keeps one lane's ``u``, so a fold or a
    flush rounds those rows differently from decode. With two key rows per thread the products
    meet inside a thread first and lanes combine only partial sums (``fma(c, 1, a) = a + c``,
    commutative), so every lane holds the same sums. Only ``kd <= 16`` with a 2-byte state
    (bf16/fp16: 8 columns per 16-byte vector, a ``16 x 16`` block on 32 threads) needs it: the
    H200 found the exact carry 1 bf16 ulp off decode there (sm_90 PTX of decode:
    ``shfl.bfly`` of both factors, then ``fma`` on the partner's product). Raises
    ``ValueError`` for a state element size other than 2 or 4 bytes."""
    if state_itemsize not in (2, 4):
        raise ValueError(f"state_itemsize: expected 2 (bf16/fp16) or 4 (fp32), got "
                         f"{state_itemsize!r}")
    bk, bv, warps = block_config(k_dim, v_dim)
    per_thread = bk * bv // (32 * warps)
    natural = min(16 // state_itemsize, bv)
    if per_thread // natural >= 2:
        return 0
    return max(1, per_thread // 2)


def block_config(k_dim: int, v_dim: int) -> tuple[int, int, int]:
    """``(BK, BV, num_warps)`` for a K-major head of ``k_dim x v_dim``.

    Every GDN kernel must launch with this config so that the reductions in ``gdn_row`` run in
    the same order everywhere (bitwise agreement). ``BK`` covers the whole key dim (padded to a
    power of two); ``BV`` columns per block, ``BK*BV = 4096`` fp32 (at least 16 columns, at most
    ``v_dim`` padded), one warp, so the key sums stay inside a warp. The ``kv_block`` setting
    (``pmll_lab.ops.settings``, for tuning sweeps) fixes ``(BV, num_warps)`` for every head
    instead; kernels launched under one setting still agree with each other bitwise, not with
    the default's last bits. Why this rule: perf-notes-archive v0."""
    return _block_config(k_dim, v_dim, settings.gdn().kv_block)


@lru_cache(maxsize=None)
def _block_config(k_dim: int, v_dim: int, kv_block) -> tuple[int, int, int]:
    bk = next_power_of_2(k_dim)
    if kv_block is not None:
        return bk, min(next_power_of_2(v_dim), kv_block.block_v), kv_block.num_warps
    bv = min(next_power_of_2(v_dim), max(16, 4096 // bk))
    return bk, bv, 1
