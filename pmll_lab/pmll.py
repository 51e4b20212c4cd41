"""PMLL: the persistent key/value memory ring (SPEC §1; seed ``000_…txt``, its bugs fixed).

A Transformer-XL style memory: each sequence keeps the last ``M`` keys and values of every head
in a ring of slots, written segment by segment (optionally gated), and the next segment's
queries attend to that memory as well as to their own segment, causally.

Public API:

- ``RingMemory``: the state ``k, v [B, H, M, D]`` and ``count [B]`` (int64, rows ever written);
  ``RingMemory.empty(...)``, ``.lengths``, ``.next_slot``, ``.reset(seqs)``.
- ``pmll_write(mem, k_new, v_new, gate=None, *, validate=False)``: Triton kernel, in place.
- ``pmll_read(mem, t_ctx) -> (k_out, v_out)``: Triton kernel, chronological, right-aligned.
- ``memory_attention(q, k_ctx, v_ctx, mem=None)``: reference path (gather + PyTorch attention).
- ``read_bytes``, ``write_bytes``: the fewest bytes each kernel must move (for GB/s).

The float64 references are in ``pmll_lab.reference.pmll``; the kernels in
``pmll_lab.ops.pmll.ring`` (whose docstring explains how ``T > M`` stays race-free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.pmll.ring import check_memory, pmll_read, pmll_write

__all__ = ["RingMemory", "pmll_write", "pmll_read", "memory_attention", "read_bytes",
           "write_bytes"]


@dataclass
class RingMemory:
    """One layer's PMLL ring for ``B`` sequences (SPEC §1).

    ``k, v [B, H, M, D]``: contiguous, fp32/bf16/fp16 (the dtype the caller picks; blends are
    computed in fp32), slot ``s`` of head ``h`` of sequence ``b`` at ``[b, h, s]``.
    ``count [B]`` int64: rows ever written per sequence (not clamped). Derived:
    ``lengths = min(count, M)`` live rows, ``next_slot = count % M``.

    Construction checks the tensors (``ValueError`` naming ``mem.k``/``mem.v``/``mem.count``).
    """

    k: torch.Tensor
    v: torch.Tensor
    count: torch.Tensor

    def __post_init__(self):
        check_memory(self)

    @classmethod
    def empty(cls, batch: int, heads: int, capacity: int, head_dim: int, *,
              dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> "RingMemory":
        """Zeroed memory with ``count = 0`` (SPEC §1 "init"); ``device`` defaults to
        ``pmll_lab.backend.DEVICE``. Raises ``ValueError`` naming a bad size, ``dtype`` or
        ``device`` (one this machine does not have)."""
        for name, value in (("batch", batch), ("heads", heads), ("capacity", capacity),
                            ("head_dim", head_dim)):
            _checks.positive_int(name, value)
        _checks.choice("dtype", dtype, _checks.FLOAT_DTYPES)
        dev = _checks.device("device", device, DEVICE)
        shape = (batch, heads, capacity, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=dev),
                   torch.zeros(shape, dtype=dtype, device=dev),
                   torch.zeros(batch, dtype=torch.int64, device=dev))

    # ---- shape and state ----------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def heads(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        """``M``, slots per head."""
        return self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` int64: live rows per sequence, ``min(count, M)`` (no host sync)."""
        return self.count.clamp(max=self.capacity)

    @property
    def next_slot(self) -> torch.Tensor:
        """``[B]`` int64: the slot the next written row lands on, ``count % M``."""
        return self.count % self.capacity

    def nbytes(self) -> int:
        """Bytes held by ``k`` and ``v``."""
        return 2 * self.k.numel() * self.k.element_size()

    def clone(self) -> "RingMemory":
        return RingMemory(self.k.clone(), self.v.clone(), self.count.clone())

    def reset(self, seqs=None) -> "RingMemory":
        """Forget sequences, in place: their rows become zero and their ``count`` 0 (SPEC §1;
        the seed reset only the length, so later gated writes blended with stale rows).

        ``seqs``: None (all sequences), a bool mask ``[B]`` (tensor or list), or sequence numbers in
        ``[0, B)``: one int, a sequence of ints or an integer index tensor (repeats allowed; the
        same forms as ``GdnCarry.reset`` / ``ConvCarry.reset``). Raises ``ValueError`` naming
        ``seqs`` on a mask of the wrong shape, a non-integer index, or an index out of range
        (that check syncs for a device tensor). Returns ``self``.
        """
        if seqs is None:
            self.k.zero_()
            self.v.zero_()
            self.count.zero_()
            return self
        if isinstance(seqs, (list, tuple)) and seqs and all(isinstance(s, bool) for s in seqs):
            seqs = torch.tensor(seqs)                      # a host bool mask
        if isinstance(seqs, torch.Tensor) and seqs.dtype == torch.bool:
            _checks.tensor("seqs", seqs, shape=(self.batch,))
            seqs = seqs.to(self.device)
            self.k.masked_fill_(seqs[:, None, None, None], 0)
            self.v.masked_fill_(seqs[:, None, None, None], 0)
            self.count.masked_fill_(seqs, 0)
            return self
        idx = _checks.index_tensor("seqs", seqs, self.batch, device=self.device)
        self.k.index_fill_(0, idx, 0)
        self.v.index_fill_(0, idx, 0)
        self.count.index_fill_(0, idx, 0)
        return self


def memory_attention(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor,
                     mem: RingMemory | None = None) -> torch.Tensor:
    """Attention of one segment over the ring memory and, causally, over itself (SPEC §1).

    ``q, k_ctx, v_ctx [B, H, T, D]`` (same dtype; the memory's dtype, heads and head size when
    ``mem`` is given). Query ``i`` of sequence ``b`` sees the ``length[b]`` live memory rows
    and context rows ``0..i``; scale ``D**-0.5``. ``mem=None`` is vanilla causal attention.
    Returns ``o [B, H, T, D]`` in ``q``'s dtype. This does not write the segment into the
    memory: call ``pmll_write(mem, k_ctx, v_ctx)`` afterwards for the next segment.

    Reference path, not a fused kernel (a fused memory-attention kernel comes later): the
    memory is gathered by the ``pmll_read`` kernel into ``[B, H, M + T, D]`` (context rows
    copied behind it), then PyTorch computes the masked attention in fp32, materialising the
    ``[B, H, T, M + T]`` scores; a memory whose every sequence is empty takes the ``mem=None``
    path (a host sync). Raises ``ValueError`` naming the argument.
    """
    _checks.tensor("q", q, ndim=4, dtype=_checks.FLOAT_DTYPES, last_contiguous=False)
    batch, heads, tokens, head_dim = q.shape
    _checks.tensor("k_ctx", k_ctx, shape=tuple(q.shape), dtype=q.dtype)
    _checks.tensor("v_ctx", v_ctx, shape=tuple(q.shape), dtype=q.dtype)
    _checks.same_device("q", q, k_ctx=k_ctx, v_ctx=v_ctx)
    scale = head_dim ** -0.5
    qf = q.float()
    if mem is None:
        scores = qf @ k_ctx.float().transpose(-1, -2) * scale
        future = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        return (torch.softmax(scores, dim=-1) @ v_ctx.float()).to(q.dtype)
    b_, h_, m_, d_ = check_memory(mem)
    if (b_, h_, d_) != (batch, heads, head_dim):
        raise ValueError(f"mem: batch/heads/head size {(b_, h_, d_)} differ from q's "
                         f"{(batch, heads, head_dim)}")
    if mem.k.dtype != q.dtype:
        raise ValueError(f"q: dtype {q.dtype} differs from the memory's {mem.k.dtype}")
    _checks.same_device("mem.k", mem.k, q=q)
    if not bool((mem.lengths > 0).any()):
        # No sequence has memory yet: exactly vanilla attention. Computed as such, since the
        # padded [T, M + T] products and softmax round differently from the [T, T] ones
        # (seen on this project's CPUs: the bits differed).
        return memory_attention(q, k_ctx, v_ctx, None)
    k_all, v_all = pmll_read(mem, tokens)                            # [B, H, M + T, D]
    k_all, v_all = k_all.float(), v_all.float()
    k_all[:, :, m_:] = k_ctx.float()
    v_all[:, :, m_:] = v_ctx.float()
    scores = qf @ k_all.transpose(-1, -2) * scale                     # [B, H, T, M + T]
    slot_row = torch.arange(m_, device=q.device)
    mem_visible = slot_row[None, :] >= (m_ - mem.lengths)[:, None]      # [B, M]
    ctx_visible = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril()
    visible = torch.cat([mem_visible[:, None, :].expand(batch, tokens, m_),
                         ctx_visible[None].expand(batch, tokens, tokens)], dim=-1)
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v_all).to(q.dtype)


def write_bytes(batch: int, heads: int, capacity: int, head_dim: int, tokens: int, *,
                dtype: torch.dtype, gate: str | None = None,
                gate_dtype: torch.dtype = torch.float32) -> int:
    """Fewest bytes ``pmll_write`` must move (SPEC §4 counting: inputs and outputs once).

    ``gate`` None, ``"bt"`` or ``"bht"``. Without a gate only the last token landing on each of
    the ``min(T, M)`` slots matters: read ``min(T, M)`` rows of ``k_new`` and ``v_new``, write
    as many slots. With a gate: read all ``T`` rows of each, the gate, and the old ``min(T, M)``
    slots (the blend needs them), write those slots. Plus ``count`` read and written (int64).
    """
    el = torch.empty((), dtype=dtype).element_size()
    row = head_dim * el * batch * heads * 2                           # one row of k and of v
    hit = min(tokens, capacity)
    count = 2 * 8 * batch
    if gate is None:
        return hit * row * 2 + count
    gel = torch.empty((), dtype=gate_dtype).element_size()
    gate_bytes = batch * tokens * gel * (heads if gate == "bht" else 1)
    return tokens * row + hit * row * 2 + gate_bytes + count


def read_bytes(lengths, heads: int, capacity: int, head_dim: int, t_ctx: int, *,
               dtype: torch.dtype) -> int:
    """Fewest bytes ``pmll_read`` must move: the live rows of ``k`` and ``v`` read once
    (``sum(lengths)`` rows per head), and the whole ``[B, H, M + t_ctx, D]`` outputs written,
    plus ``count`` read. ``lengths``: ``mem.lengths`` (tensor; syncs) or a list of ints."""
    el = torch.empty((), dtype=dtype).element_size()
    lengths = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    batch = len(lengths)
    row = head_dim * el * heads * 2
    return sum(lengths) * row + batch * (capacity + t_ctx) * row + 8 * batch
