"""PMLL: the persistent key/value memory ring (SPEC §1; seed ``000_…txt``, its bugs fixed).

A Transformer-XL style memory: each sequence keeps the last ``M`` keys and values of every head
in a ring of slots, written segment by segment (optionally gated), and the next segment's
queries attend to that memory as well as to their own segment, causally.

Public API:

- ``RingMemory``: the state ``k, v [B, H, M, D]`` and ``count [B]`` (int64, rows ever written);
  ``RingMemory.empty(...)``, ``.lengths``, ``.next_slot``, ``.reset(seqs)``.
- ``pmll_write(mem, k_new, v_new, gate=None, *, validate=False, impl="triton")``: Triton kernel
  (``impl="cuda"``: its CUDA C++ twin, ``kernels/pmll_ring.cu``), in place.
- ``pmll_read(mem, t_ctx, *, impl="triton") -> (k_out, v_out)``: Triton kernel (or its CUDA
  twin), chronological, right-aligned.
- ``memory_attention(q, k_ctx, v_ctx, mem=None, *, impl=None)``: a segment's attention over the
  ring and itself: ``impl="fused"`` (Triton, the ring read in place:
  ``pmll_lab.ops.pmll.ring_attention``) or ``"reference"`` (gather + PyTorch attention, the
  oracle); ``MEMORY_ATTENTION_IMPL`` is the default.
- ``pmll_step(mem, q, k, v, gate=None, *, impl=None, validate=False)``: one layer's segment step, attention
  then the gated write of the segment into the ring (what a model loop calls).
- ``read_bytes``, ``write_bytes``: the fewest bytes each kernel must move (for GB/s).

The float64 references are in ``pmll_lab.reference.pmll``; the kernels in
``pmll_lab.ops.pmll.ring`` (whose docstring explains how ``T > M`` stays race-free).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from pmll_lab import _checks, cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.ops.pmll.ring import check_memory, check_write, launch_write, pmll_read, pmll_write
from pmll_lab.ops.pmll.ring_attention import check_attention, launch_ring_attention
from pmll_lab.sizes import count as _size_arg, itemsize

__all__ = ["RingMemory", "pmll_write", "pmll_read", "memory_attention", "pmll_step",
           "MEMORY_ATTENTION_IMPL", "IMPLS", "read_bytes", "write_bytes"]

IMPLS = ("fused", "reference")
WRITE_GATES = (None, "bt", "bht")
"""``pmll_write``'s gate: none, one per token ``[B, T]``, one per head and token ``[B, H, T]``."""
"""The ways ``memory_attention`` computes: the Triton kernel reading the ring in place, or the
gather + PyTorch reference path (the oracle the kernel is tested against)."""
MEMORY_ATTENTION_IMPL = "fused" if DEVICE.type == "cuda" else "reference"
"""Default ``impl`` of ``memory_attention`` and ``pmll_step``: the fused kernel on a GPU (on an
NVIDIA H200 it took 0.35-0.45x the time of gather + masked SDPA over the whole grid of
notebook ``pmll_attention``'s full preset; reports/perf-notes.md, "Ring attention"), the
reference path on the CPU, where the Triton interpreter is far slower than PyTorch. The fused
path is checked against the reference in ``tests/pmll/test_ring_attention.py`` either way."""


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
        # counts are set once here and then only grown by the kernels; a negative count would
        # put the next write before the ring (one host sync, at construction only)
        if self.count.numel() and int(self.count.min()) < 0:
            raise ValueError(f"mem.count: must be >= 0 (rows ever written), got "
                             f"{self.count.tolist()}")

    @classmethod
    def empty(cls, batch: int, heads: int, capacity: int, head_dim: int, *,
              dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None) -> "RingMemory":
        """Zeroed memory with ``count = 0`` (SPEC §1 "init"); ``device`` defaults to
        ``pmll_lab.backend.DEVICE``. Raises ``ValueError`` naming a bad size (below 1, or a ring
        larger than the device's memory), ``dtype`` or ``device`` (one this machine does not
        have), before any allocation."""
        for name, value in (("batch", batch), ("heads", heads), ("capacity", capacity),
                            ("head_dim", head_dim)):
            _checks.positive_int(name, value)
        _checks.choice("dtype", dtype, _checks.FLOAT_DTYPES)
        dev = _checks.device("device", device, DEVICE)
        shape = (batch, heads, capacity, head_dim)
        _checks.fits("batch, heads, capacity, head_dim",
                     2 * math.prod(shape) * dtype.itemsize + 8 * batch, dev,
                     f"a ring of k, v {list(shape)} and count [{batch}]")
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


def _impl(impl) -> str:
    """``memory_attention``'s ``impl``: one of ``IMPLS``, ``None`` (the default) or
    ``"triton"`` (the fused kernel, as every launcher's ``impl="triton"``)."""
    impl = MEMORY_ATTENTION_IMPL if impl is None else impl
    if impl == "cuda":
        raise ValueError("impl: the ring attention has no CUDA twin (impl='cuda' is taken by "
                         f"{', '.join(cuda_ext.TWIN_LAUNCHERS)}); use 'fused' (or 'triton') "
                         "or 'reference'")
    if impl == "triton":
        return "fused"
    if impl not in IMPLS:
        raise ValueError(f"impl: must be one of {', '.join(repr(i) for i in IMPLS)}, 'triton' or "
                         f"None, got {impl!r}")
    return impl


def memory_attention(q: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor,
                     mem: RingMemory | None = None, *, impl: str | None = None) -> torch.Tensor:
    """Attention of one segment over the ring memory and, causally, over itself (SPEC §1).

    ``q, k_ctx, v_ctx [B, H, T, D]`` (same dtype, fp32/bf16/fp16; the memory's dtype, heads and
    head size when ``mem`` is given). Query ``i`` of sequence ``b`` sees the ``length[b]`` live
    memory rows and context rows ``0..i``; scale ``D**-0.5``. ``mem=None`` is vanilla causal
    attention. Returns ``o [B, H, T, D]`` in ``q``'s dtype. This does not write the segment
    into the memory: ``pmll_step`` does both, or call ``pmll_write(mem, k_ctx, v_ctx)``.

    ``impl`` (default ``MEMORY_ATTENTION_IMPL``):

    - ``"fused"`` (or ``"triton"``): one Triton flash-attention launch (``pmll_lab.ops.pmll.ring_attention``)
      that reads the live ring rows in place, in chronological order, then the segment's keys
      causally; fp32 softmax and accumulation, probabilities rounded to the dtype for ``p @ v``
      (as FlashAttention does). No gather, no mask, no scores in memory, no host sync. The
      tensors must be on the kernels' device. Forward only: inputs that require grad (with
      grad mode on) raise ``ValueError``. Rows are addressed with int32 offsets within one
      ``(b, h)``: ``T * stride`` and ``M * D`` must stay below 2**31 elements.
    - ``"reference"``: the memory gathered by the ``pmll_read`` kernel into ``[B, H, M + T, D]``
      (context rows copied behind it), then PyTorch computes the masked attention in fp32,
      materialising the ``[B, H, T, M + T]`` scores; a memory whose every sequence is empty
      takes the ``mem=None`` path (a host sync).

    Raises ``ValueError`` naming the argument (``q``, ``k_ctx``, ``v_ctx``, ``mem``, ``mem.*``,
    ``impl``) before any kernel runs, the same checks for both paths. Source: SPEC §1 (seed
    ``000_…txt``); the fused kernel is a flash-attention forward (Dao et al. 2022, Dao 2023).
    """
    impl = _impl(impl)
    return _attend(q, k_ctx, v_ctx, mem, impl, check_attention(q, k_ctx, v_ctx, mem))


def _attend(q, k_ctx, v_ctx, mem, impl: str, dims: tuple[int, int, int, int]) -> torch.Tensor:
    """``memory_attention`` after its ``check_attention`` (``dims``: what it returned)."""
    batch, heads, tokens, head_dim = dims
    if impl == "fused":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_ctx, v_ctx)):
            raise ValueError("impl: the fused kernel is forward-only (no backward pass); with "
                             "inputs that require grad use impl='reference', or run under "
                             "torch.no_grad() / torch.inference_mode()")
        return launch_ring_attention(q, k_ctx, v_ctx, mem, dims)
    scale = head_dim ** -0.5
    qf = q.float()
    if mem is None:
        scores = qf @ k_ctx.float().transpose(-1, -2) * scale
        future = torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        return (torch.softmax(scores, dim=-1) @ v_ctx.float()).to(q.dtype)
    m_ = mem.k.shape[2]
    if not bool((mem.lengths > 0).any()):
        # No sequence has memory yet: exactly vanilla attention. Computed as such, since the
        # padded [T, M + T] products and softmax round differently from the [T, T] ones
        # (seen on this project's CPUs: the bits differed).
        return _attend(q, k_ctx, v_ctx, None, "reference", dims)
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


_STEP_NAMES = {"k_ctx": "k", "k_new": "k", "v_ctx": "v", "v_new": "v"}


@contextlib.contextmanager
def _step_names():
    """Errors of the shared checks renamed to ``pmll_step``'s own arguments (``k``, ``v``)."""
    try:
        yield
    except ValueError as exc:
        msg = str(exc)
        head, sep, rest = msg.partition(":")
        if sep and head in _STEP_NAMES:
            raise ValueError(f"{_STEP_NAMES[head]}:{rest}") from None
        raise


def pmll_step(mem: RingMemory | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              gate: torch.Tensor | None = None, *, impl: str | None = None,
              validate: bool = False) -> torch.Tensor:
    """One PMLL layer's segment step: attention over the ring and the segment, then the
    segment written into the ring (SPEC §1), the call a model's attention layer makes per
    segment.

    ``q, k, v [B, H, T, D]``: the segment's queries, keys and values, fp32/bf16/fp16 (the ring's
    dtype), on the ring's device; ``k`` and ``v`` with the last dim contiguous (the write
    kernel's rule; other strides free, e.g. heads split out of a fused projection). ``gate``:
    None (``g = 1``), ``[B, T]`` or ``[B, H, T]`` in ``[0, 1]``: how much of each token is
    blended into its slot (``pmll_write``). ``mem``: the layer's ``RingMemory``, updated in
    place (``count += T``); None: memory off, plain causal attention and nothing written
    (``gate`` must then be None).

    Returns ``o [B, H, T, D]`` in ``q``'s dtype: ``memory_attention(q, k, v, mem, impl=impl)``
    over the ring as it was *before* this segment (the segment's own keys are attended
    causally), after which the segment is in the ring for the next step. With ``gate=None``,
    ``M`` at least the tokens seen and segments fed in order with continuing positions, the
    steps' outputs equal causal attention over the whole sequence (SPEC §1; tested on GPT-2 in
    ``tests/pmll/test_ring_attention.py``).

    Raises ``ValueError`` naming the argument before any kernel runs: the attention checks (``q``,
    ``k``, ``v``, ``mem``, ``impl``) and the write checks (``k``/``v`` strides, ``gate`` shape and
    dtype; ``gate`` given without a ring). ``validate=True`` adds, as on ``pmll_write`` (the rule of
    every launcher: ``pmll_lab._checks``; docs/layouts.md, "validate=True"), the value checks that
    sync with the device: every gate value finite and in ``[0, 1]`` (a gate of 2 would write
    ``2*k``, a NaN would poison the ring), ``q``, ``k``, ``v`` and the ring's rows finite, and
    ``mem.count >= 0``.
    Two launches on the fused path (attention, write), no host sync (without ``validate``):
    capturable in a CUDA graph. Source: the seed's memory layer (``000_…txt``), its read-attend-write order.
    """
    impl = _impl(impl)
    _checks.flag("validate", validate)
    with _step_names():
        dims = check_attention(q, k, v, mem)
        if mem is None:
            if gate is not None:
                raise ValueError("gate: given, but mem is None (no ring to write into)")
        else:
            check_write(mem, k, v, gate, validate=validate)
        if validate:
            _checks.finite_inputs({"q": q, "k": k, "v": v})
    o = _attend(q, k, v, mem, impl, dims)                 # checked once, above
    if mem is not None:
        launch_write(mem, k, v, gate)
    return o


def write_bytes(batch: int, heads: int, capacity: int, head_dim: int, tokens: int, *,
                dtype: torch.dtype, gate: str | None = None,
                gate_dtype: torch.dtype = torch.float32) -> int:
    """Fewest bytes ``pmll_write`` must move (SPEC §4 counting: inputs and outputs once).

    ``gate`` None, ``"bt"`` or ``"bht"``. Without a gate only the last token landing on each of
    the ``min(T, M)`` slots matters: read ``min(T, M)`` rows of ``k_new`` and ``v_new``, write
    as many slots. With a gate: read all ``T`` rows of each, the gate, and the old ``min(T, M)``
    slots (the blend needs them), write those slots. Plus ``count`` read and written (int64).
    Raises ``ValueError`` naming a size below 1 (``batch``, ``tokens`` below 0), a dtype other
    than fp32/bf16/fp16 or an unknown ``gate``.
    """
    for name, value in (("heads", heads), ("capacity", capacity), ("head_dim", head_dim)):
        _size_arg(name, value)
    _size_arg("batch", batch, minimum=0)
    _size_arg("tokens", tokens, minimum=0)
    _checks.choice("gate", gate, WRITE_GATES)
    el = itemsize("dtype", dtype)
    row = head_dim * el * batch * heads * 2                           # one row of k and of v
    hit = min(tokens, capacity)
    count = 2 * 8 * batch
    if gate is None:
        return hit * row * 2 + count
    gel = itemsize("gate_dtype", gate_dtype)
    gate_bytes = batch * tokens * gel * (heads if gate == "bht" else 1)
    return tokens * row + hit * row * 2 + gate_bytes + count


def read_bytes(lengths, heads: int, capacity: int, head_dim: int, t_ctx: int, *,
               dtype: torch.dtype) -> int:
    """Fewest bytes ``pmll_read`` must move: the live rows of ``k`` and ``v`` read once
    (``sum(lengths)`` rows per head), and the whole ``[B, H, M + t_ctx, D]`` outputs written,
    plus ``count`` read. ``lengths``: ``mem.lengths`` (tensor; syncs) or a list of ints in
    ``[0, capacity]``. Raises ``ValueError`` naming a bad size, length or dtype."""
    for name, value in (("heads", heads), ("capacity", capacity), ("head_dim", head_dim)):
        _size_arg(name, value)
    _size_arg("t_ctx", t_ctx, minimum=0)
    el = itemsize("dtype", dtype)
    raw = lengths.tolist() if isinstance(lengths, torch.Tensor) else _checks.int_list(
        "lengths", lengths)
    lengths = [_size_arg("lengths", x, minimum=0) for x in raw]
    if any(x > capacity for x in lengths):
        raise ValueError(f"lengths: entries must lie in [0, capacity = {capacity}], got "
                         f"{max(lengths)}")
    batch = len(lengths)
    row = head_dim * el * heads * 2
    return sum(lengths) * row + batch * (capacity + t_ctx) * row + 8 * batch
