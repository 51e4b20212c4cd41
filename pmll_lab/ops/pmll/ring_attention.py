"""Triton kernel: a segment's attention over the PMLL ring, read in place (SPEC §1 "attention").

Computes what ``pmll_lab.pmll.memory_attention``'s reference path computes, without gathering
the ring and without a mask or scores in memory: a flash-attention forward pass (online softmax,
Dao et al. 2022, "FlashAttention"; the two-loop causal split of FlashAttention-2, Dao 2023) whose
keys come from two places:

1. **the ring**, in chronological order by index arithmetic: for sequence ``b`` with
   ``n = count[b]`` rows ever written, ``length = min(n, M)`` rows are live and the oldest sits
   in slot ``oldest = (n - length) % M``; memory key ``i`` (``0 <= i < length``, oldest first)
   is slot ``(oldest + i) % M``. Every live row is visible to every query. Ragged lengths across
   the batch cost nothing: each program loads its own ``count`` and loops ``length`` rows.
2. **the segment's own keys** ``k_ctx[b, h, j]``, ``j <= i`` for query ``i`` (causal): key
   blocks wholly below the query block's diagonal without a mask, then the diagonal blocks with
   the causal mask (FlashAttention-2's split).

Buffers: ``q, k_ctx, v_ctx [B, H, T, D]`` any strides with the last dim contiguous (the
launcher copies an input whose last dim is not); the ring ``mem.k, mem.v [B, H, M, D]``
contiguous, ``mem.count [B]`` int64 (``pmll_lab.ops.pmll.ring``); output ``o [B, H, T, D]``
contiguous, ``q``'s dtype. fp32/bf16/fp16 inputs, one dtype for all.

Arithmetic: scores ``q.k`` in fp32 (``tl.dot`` with fp32 accumulation; fp32 inputs with IEEE
fp32 products, not TF32), scale ``D**-0.5`` folded with ``log2(e)`` into one multiply so the
softmax uses ``exp2``; running max, sum and the ``[BLOCK_M, D]`` accumulator in fp32; the
probabilities are rounded to the value dtype for the ``p @ v`` product (as FlashAttention does);
the output is divided by the sum once and rounded once to the dtype. Under the Triton
interpreter (CPU) the 16-bit operands of each ``tl.dot`` are widened to fp32 first (the same
values): Triton 3.6's interpreter multiplies bf16 operands as their raw 16-bit patterns (NumPy
has no bf16), and fp16 is widened too so both dtypes take one path; the CPU then computes what
the GPU's fp32-accumulating tensor-core products compute, up to summation order.

Grid: ``(ceil(T / BLOCK_M), B * H)``; axis 0 runs the query blocks of one ``(b, h)`` next to
each other (they share its keys in L2), the last (most work under the causal mask) first.
Offsets of a ``(b, h)`` base are int64; rows within one ``(b, h)`` use int32 offsets
(``T * stride`` and ``M * D`` below 2**31 elements).

Tiles come from the ``attention`` launch settings (``pmll_lab.ops.settings``: head size and
element size -> block sizes, warps, stages), filled by ``scripts/tune_pmll.py attention`` from
an H200 sweep.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.ops import settings
from pmll_lab.ops.host import cdiv, next_power_of_2
from pmll_lab.ops.pmll.ring import check_memory

LOG2E = 1.4426950408889634


@triton.jit
def _step(acc, l_i, m_i, qt, kt, vt, visible, qk_scale,
          MASKED: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One block of keys: scores, online-softmax rescale, accumulate ``p @ v``."""
    if UPCAST:                     # the interpreter's tl.dot mishandles bf16: same values in fp32
        qt, kt = qt.to(tl.float32), kt.to(tl.float32)
    s = tl.dot(qt, kt, input_precision=PRECISION) * qk_scale          # [BLOCK_M, BLOCK_N], log2
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    p = p.to(vt.dtype)
    if UPCAST:
        p, vt = p.to(tl.float32), vt.to(tl.float32)
    acc = tl.dot(p, vt, acc, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def ring_attention_kernel(
    q, k_ctx, v_ctx, k_mem, v_mem, count, out,
    H, T, M, D,
    s_qb, s_qh, s_qt,
    s_kb, s_kh, s_kt,
    s_vb, s_vh, s_vt,
    qk_scale,
    HAS_MEM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """The fused attention of the module docstring (its buffers, dtypes and arithmetic): grid
    ``(cdiv(T, BLOCK_M), B * H)``, heaviest query block first; ``HAS_MEM`` False skips the ring.
    Launched by ``launch_ring_attention`` (tile from ``tile_for``) after ``check_attention``
    (a kernel raises nothing); public for the sm_90 compile check (tests/pmll/test_ring_attention.py)."""
    start = tl.num_programs(0) - 1 - tl.program_id(0)           # heaviest query block first
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    rows = start * BLOCK_M + tl.arange(0, BLOCK_M)               # query rows of this block
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q_ptrs = q + b * s_qb + h * s_qh + rows[:, None] * s_qt + d[None, :]
    qt = tl.load(q_ptrs, mask=(rows < T)[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    if HAS_MEM:
        # memory keys: the live ring rows, oldest first, all visible
        n = tl.load(count + b)
        length = tl.minimum(n, M).to(tl.int32)
        oldest = ((n - length) % M).to(tl.int32)
        k_base = k_mem + pid_bh * M * D
        v_base = v_mem + pid_bh * M * D
        cols = tl.arange(0, BLOCK_N)
        full = (length // BLOCK_N) * BLOCK_N
        for i0 in range(0, full, BLOCK_N):                        # whole blocks: no mask
            slot = oldest + i0 + cols
            slot = tl.where(slot >= M, slot - M, slot)
            kt = tl.load(k_base + slot[None, :] * D + d[:, None], mask=dmask[:, None], other=0.0)
            vt = tl.load(v_base + slot[:, None] * D + d[None, :], mask=dmask[None, :], other=0.0)
            acc, l_i, m_i = _step(acc, l_i, m_i, qt, kt, vt, None, qk_scale,
                                  MASKED=False, PRECISION=PRECISION, UPCAST=UPCAST)
        if full < length:                                         # the last, partial block
            i = full + cols
            live = i < length
            slot = oldest + i
            slot = tl.where(slot >= M, slot - M, slot)
            slot = tl.where(live, slot, 0)
            kt = tl.load(k_base + slot[None, :] * D + d[:, None],
                         mask=live[None, :] & dmask[:, None], other=0.0)
            vt = tl.load(v_base + slot[:, None] * D + d[None, :],
                         mask=live[:, None] & dmask[None, :], other=0.0)
            acc, l_i, m_i = _step(acc, l_i, m_i, qt, kt, vt, live[None, :], qk_scale,
                                  MASKED=True, PRECISION=PRECISION, UPCAST=UPCAST)

    # the segment's own keys: blocks below the diagonal unmasked, then the diagonal causally
    kc_base = k_ctx + b * s_kb + h * s_kh
    vc_base = v_ctx + b * s_vb + h * s_vh
    ccols = tl.arange(0, BLOCK_C)
    below = start * BLOCK_M
    for j0 in range(0, below, BLOCK_C):
        j = j0 + ccols
        kt = tl.load(kc_base + j[None, :] * s_kt + d[:, None], mask=dmask[:, None], other=0.0)
        vt = tl.load(vc_base + j[:, None] * s_vt + d[None, :], mask=dmask[None, :], other=0.0)
        acc, l_i, m_i = _step(acc, l_i, m_i, qt, kt, vt, None, qk_scale,
                              MASKED=False, PRECISION=PRECISION, UPCAST=UPCAST)
    for j0 in range(below, tl.minimum(below + BLOCK_M, T), BLOCK_C):
        j = j0 + ccols
        jin = j < T
        kt = tl.load(kc_base + j[None, :] * s_kt + d[:, None],
                     mask=jin[None, :] & dmask[:, None], other=0.0)
        vt = tl.load(vc_base + j[:, None] * s_vt + d[None, :],
                     mask=jin[:, None] & dmask[None, :], other=0.0)
        visible = (j[None, :] <= rows[:, None]) & jin[None, :]
        acc, l_i, m_i = _step(acc, l_i, m_i, qt, kt, vt, visible, qk_scale,
                              MASKED=True, PRECISION=PRECISION, UPCAST=UPCAST)

    o = acc / l_i[:, None]
    o_ptrs = out + pid_bh * T * D + rows[:, None] * D + d[None, :]
    tl.store(o_ptrs, o.to(out.dtype.element_ty), mask=(rows < T)[:, None] & dmask[None, :])


# ---- launcher ---------------------------------------------------------------------------------

def check_attention(q, k_ctx, v_ctx, mem) -> tuple[int, int, int, int]:
    """The argument checks of ``memory_attention`` (both paths); returns ``(B, H, T, D)``.

    ``q, k_ctx, v_ctx [B, H, T, D]``, one float dtype (fp32/bf16/fp16), one device; ``mem``
    None or a ring (``check_memory``) of the same batch, heads, head size and dtype, on ``q``'s
    device. Raises ``ValueError`` naming ``q``, ``k_ctx``, ``v_ctx``, ``mem`` or ``mem.*``: ``q``
    is checked against the memory first, then ``k_ctx`` and ``v_ctx`` against ``q``, so the
    error names the odd one out (``q`` when only its batch/heads/head size differs from the
    memory's and ``k_ctx``'s; ``mem`` when ``q`` and ``k_ctx`` agree and the memory differs)."""
    _checks.tensor("q", q, ndim=4, dtype=_checks.FLOAT_DTYPES, last_contiguous=False)
    batch, heads, tokens, head_dim = q.shape
    if head_dim < 1:
        raise ValueError(f"q: head size must be >= 1, got shape {tuple(q.shape)}")
    if mem is not None:
        b_, h_, _, d_ = check_memory(mem)
        if (b_, h_, d_) != (batch, heads, head_dim):
            k_fits = (isinstance(k_ctx, torch.Tensor) and k_ctx.dim() == 4
                      and (k_ctx.shape[0], k_ctx.shape[1], k_ctx.shape[3]) == (b_, h_, d_))
            if k_fits:
                raise ValueError(f"q: batch/heads/head size {(batch, heads, head_dim)} differ "
                                 f"from the memory's and k_ctx's {(b_, h_, d_)}")
            raise ValueError(f"mem: batch/heads/head size {(b_, h_, d_)} differ from q's "
                             f"{(batch, heads, head_dim)}")
        if mem.k.dtype != q.dtype:
            raise ValueError(f"q: dtype {q.dtype} differs from the memory's {mem.k.dtype}")
        _checks.same_device("mem.k", mem.k, q=q)
    _checks.tensor("k_ctx", k_ctx, shape=tuple(q.shape), dtype=q.dtype, like="q")
    _checks.tensor("v_ctx", v_ctx, shape=tuple(q.shape), dtype=q.dtype, like="q")
    _checks.same_device("q", q, k_ctx=k_ctx, v_ctx=v_ctx)
    return batch, heads, tokens, head_dim


def tile_for(head_dim: int, dtype: torch.dtype, tokens: int) -> dict:
    """Launch tile for a head size, dtype and segment length: ``BLOCK_M`` (queries per program,
    at most ``T`` rounded up to a power of two, >= 16 for ``tl.dot``), ``BLOCK_N`` (ring rows per
    step), ``BLOCK_C`` (segment keys per step, dividing ``BLOCK_M``), ``BLOCK_D``, ``num_warps``,
    ``num_stages``; from the ``attention_tiles`` setting (``attention_default_tile`` for sizes it
    lacks, at most 64 x 32 above ``D = 128``)."""
    block_d = max(16, next_power_of_2(head_dim))
    el = torch.empty((), dtype=dtype).element_size()
    tile = settings.attention_tile(block_d, el)
    bm = min(tile.block_m, max(16, next_power_of_2(tokens)))
    return dict(BLOCK_M=bm, BLOCK_N=tile.block_n, BLOCK_C=min(tile.block_n, bm), BLOCK_D=block_d,
                num_warps=tile.num_warps, num_stages=tile.num_stages)


def ring_attention(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, mem=None, *,
                   tile: dict | None = None) -> torch.Tensor:
    """Attention of a segment over the ring (read in place) and causally over itself (SPEC §1).

    ``q, k_ctx, v_ctx [B, H, T, D]``, fp32/bf16/fp16, on the kernels' device
    (``pmll_lab.backend.DEVICE``); any strides, an input whose last dim is not contiguous is
    copied first. ``mem``: None (plain causal attention) or a ring ``[B, H, M, D]`` of the same
    dtype (``pmll_lab.pmll.RingMemory``). Query ``i`` of sequence ``b`` sees the
    ``min(count[b], M)`` live ring rows and segment keys ``0..i``; scale ``D**-0.5``. Returns a
    new contiguous ``o [B, H, T, D]`` in ``q``'s dtype. No host sync: capturable in a CUDA graph.

    ``tile``: a dict like ``tile_for``'s (for tuning); default ``tile_for(D, dtype, T)``.
    Raises ``ValueError`` naming the argument before launching (``check_attention``, and
    ``q`` when the tensors are not on the kernels' device). Source: flash-attention forward
    (Dao et al. 2022; Dao 2023) over SPEC §1's chronological ring order.
    """
    dims = check_attention(q, k_ctx, v_ctx, mem)
    return launch_ring_attention(q, k_ctx, v_ctx, mem, dims, tile)


def launch_ring_attention(q, k_ctx, v_ctx, mem, dims: tuple[int, int, int, int], tile=None):
    """``ring_attention`` after its ``check_attention`` (the caller ran it; ``dims`` is what it
    returned): a model loop checks a layer's inputs once per segment, not once per call level.
    Still raises ``ValueError`` naming ``q`` off the kernels' device, and ``tile``."""
    batch, heads, tokens, head_dim = dims
    if q.device.type != DEVICE.type:
        raise ValueError(f"q: on {q.device}, but the kernels run on {DEVICE}")
    out = torch.empty(batch, heads, tokens, head_dim, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    q, k_ctx, v_ctx = (t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()
                       for t in (q, k_ctx, v_ctx))
    cfg = dict(tile_for(head_dim, q.dtype, tokens) if tile is None else tile)
    if cfg["BLOCK_M"] % cfg["BLOCK_C"]:
        raise ValueError(f"tile: BLOCK_C {cfg['BLOCK_C']} must divide BLOCK_M {cfg['BLOCK_M']}")
    if mem is None:
        k_mem = v_mem = q                                    # never read (HAS_MEM=False)
        count, capacity = q, 1
    else:
        k_mem, v_mem, count, capacity = mem.k, mem.v, mem.count, mem.k.shape[2]
    grid = (cdiv(tokens, cfg["BLOCK_M"]), batch * heads)
    ring_attention_kernel[grid](
        q, k_ctx, v_ctx, k_mem, v_mem, count, out,
        heads, tokens, capacity, head_dim,
        *q.stride()[:3], *k_ctx.stride()[:3], *v_ctx.stride()[:3],
        head_dim ** -0.5 * LOG2E,
        HAS_MEM=mem is not None,
        PRECISION="ieee" if q.dtype == torch.float32 or INTERPRET else "tf32",
        UPCAST=INTERPRET,
        **cfg,
    )
    return out


def attention_flops(batch: int, heads: int, tokens: int, head_dim: int, lengths) -> float:
    """Multiply-add FLOPs of the attention a ring attention launch computes (``q.k`` and
    ``p.v``, 2 FLOPs per multiply-add): per sequence ``4 * H * D * T * (length + (T + 1) / 2)``.
    ``lengths``: live ring rows per sequence (list or tensor; 0 without memory)."""
    lengths = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
    if len(lengths) != batch:
        raise ValueError(f"lengths: expected {batch} entries, got {len(lengths)}")
    return float(sum(4 * heads * head_dim * tokens * (int(n) + (tokens + 1) / 2)
                     for n in lengths))


__all__ = ["check_attention", "tile_for", "ring_attention",
           "launch_ring_attention", "attention_flops"]
