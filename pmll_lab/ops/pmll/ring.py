"""Triton kernels for the PMLL memory ring: the gated write and the chronological read (SPEC §1).

Buffers (one layer's ring, ``mem`` is any object with these three tensors, normally a
``pmll_lab.pmll.RingMemory``):

- ``mem.k, mem.v [B, H, M, D]``: contiguous, fp32, bf16 or fp16; slot ``s`` of head ``h`` of
  sequence ``b`` is the row ``[b, h, s, :]``.
- ``mem.count [B]`` int64: rows ever written to sequence ``b``. ``length = min(count, M)``,
  the next slot written is ``count % M``, the oldest live row is slot ``(count - length) % M``.

Write (``pmll_write``): one program per ``(b, h)`` and block of ``BLOCK_S`` *target slots*.
Program ``j`` of ``(b, h)`` owns the slots hit first by tokens ``t = j*BLOCK_S ..`` of the
segment (``slot = (count + t) % M`` for ``t < min(T, M)``); every later token that lands on one
of those slots (``t + M``, ``t + 2M`` ... ``< T``) is blended in by the same program, in token
order. Each slot has exactly one owner, so ``T > M`` gives the exact sequential result with no
race (the seed's kernel had one program per token and raced there). Blends are computed in fp32
and rounded to the memory dtype after every token that lands on a slot, which is what applying
the rows one call at a time would store: writing a segment equals writing it token by token,
bit for bit (a test). With ``gate=None`` the blend is ``mem = new`` and only the last token on
each slot matters, so the kernel copies that row without reading the old memory.

Read (``pmll_read``): one program per ``(b, h)`` and block of ``BLOCK_S`` output rows. Output
row ``r < M`` holds slot ``(count - length + r - (M - length)) % M`` when ``r >= M - length``,
else zero; rows ``M .. M + t_ctx - 1`` are zero. Every output row is written by the kernel, so
the outputs are allocated with ``torch.empty`` (no separate zero-fill pass over the output).

Both kernels move whole rows: a ``[BLOCK_S, BLOCK_D]`` tile per tensor, ``BLOCK_D`` = the head
size padded to a power of two (contiguous, so loads and stores vectorise to 16 bytes when ``D``
is a multiple of 8 elements of 16 bits). Offsets are int64 (a 2 GB ring has more than 2**31
bytes). The tile size and warp count are the ``ring`` launch settings
(``pmll_lab.ops.settings``, with the measurement behind them).

``impl="cuda"`` on both launchers runs the CUDA C++ twins instead (``kernels/pmll_ring.cu``,
built on first use by ``pmll_lab.cuda_ext``) after the same argument checks, with the same
state semantics (the launcher adds ``T`` to ``count`` after the twin's write).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pmll_lab import _checks, cuda_ext
from pmll_lab.backend import DEVICE
from pmll_lab.ops import settings
from pmll_lab.ops.host import cdiv, next_power_of_2

def ring_tile(head_dim: int, rows: int) -> tuple[int, int]:
    """``(BLOCK_S, BLOCK_D)``: the head size padded to a power of two, and enough slots per
    program to make a tile of ``ring_tile_elems`` elements (``pmll_lab.ops.settings``; fewer
    when there are fewer rows). ``head_dim >= 1`` and ``rows >= 0`` ints (the launchers have
    checked them); both results are powers of two, ``BLOCK_S >= 1``. The ring write and read
    launches' block shape, read at launch time so a settings override takes effect."""
    block_d = next_power_of_2(head_dim)
    elems = settings.ring().ring_tile_elems
    block_s = max(1, min(next_power_of_2(max(rows, 1)), elems // block_d))
    return block_s, block_d


@triton.jit
def _ring_write_kernel(
    k_mem, v_mem, count,
    k_new, v_new, gate,
    H, M, T, D,
    s_kb, s_kh, s_kt,
    s_vb, s_vh, s_vt,
    s_gb, s_gh, s_gt,
    n_pass,
    HAS_GATE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    n = tl.load(count + b)                                     # int64 rows written so far
    t = tl.program_id(1).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    live = t < tl.minimum(T, M)                                # first token on each owned slot
    slot = (n + t) % M
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    tile = live[:, None] & dmask[None, :]
    mem_off = pid_bh * M * D + slot[:, None] * D + d[None, :]
    kn_base = k_new + b * s_kb + h * s_kh
    vn_base = v_new + b * s_vb + h * s_vh
    if HAS_GATE:
        acc_k = tl.load(k_mem + mem_off, mask=tile, other=0.0).to(tl.float32)
        acc_v = tl.load(v_mem + mem_off, mask=tile, other=0.0).to(tl.float32)
        g_base = gate + b * s_gb + h * s_gh
        for j in range(n_pass):
            tt = t + j * M                                     # tokens landing on the slots
            on = live & (tt < T)
            on2 = on[:, None] & dmask[None, :]
            g = tl.load(g_base + tt * s_gt, mask=on, other=0.0).to(tl.float32)[:, None]
            kn = tl.load(kn_base + tt[:, None] * s_kt + d[None, :], mask=on2, other=0.0)
            vn = tl.load(vn_base + tt[:, None] * s_vt + d[None, :], mask=on2, other=0.0)
            bk = g * kn.to(tl.float32) + (1.0 - g) * acc_k
            bv = g * vn.to(tl.float32) + (1.0 - g) * acc_v
            # round to the memory dtype after each token, as a one-token call would store it
            acc_k = tl.where(on2, bk.to(k_mem.dtype.element_ty).to(tl.float32), acc_k)
            acc_v = tl.where(on2, bv.to(v_mem.dtype.element_ty).to(tl.float32), acc_v)
        tl.store(k_mem + mem_off, acc_k.to(k_mem.dtype.element_ty), mask=tile)
        tl.store(v_mem + mem_off, acc_v.to(v_mem.dtype.element_ty), mask=tile)
    else:
        last = t + ((T - 1 - t) // M) * M                      # last token on each slot (g = 1)
        kn = tl.load(kn_base + last[:, None] * s_kt + d[None, :], mask=tile, other=0.0)
        vn = tl.load(vn_base + last[:, None] * s_vt + d[None, :], mask=tile, other=0.0)
        tl.store(k_mem + mem_off, kn.to(k_mem.dtype.element_ty), mask=tile)
        tl.store(v_mem + mem_off, vn.to(v_mem.dtype.element_ty), mask=tile)


@triton.jit
def ring_read_kernel(
    k_mem, v_mem, count, k_out, v_out,
    H, M, R, D,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``pmll_read``'s copy: ``k_mem, v_mem [B, H, M, D]`` (contiguous) and ``count [B]`` (rows
    written so far) into ``k_out, v_out [B, H, R, D]`` (``R = M + t_ctx``, the memory's dtype):
    rows ``M - length .. M - 1`` the live ring rows oldest first, every other row zero. Grid
    ``(B * H, cdiv(R, BLOCK_S))`` (``ring_tile``); launched by ``pmll_read`` after its checks (a
    kernel raises nothing). Public so a test can make sure no launch precedes the checks."""
    pid_bh = tl.program_id(0).to(tl.int64)
    b = pid_bh // H
    n = tl.load(count + b)
    length = tl.minimum(n, M)
    oldest = (n - length) % M
    r = tl.program_id(1).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    i = r - (M - length)                                       # chronological index
    live = (r < M) & (i >= 0)
    slot = (oldest + tl.where(live, i, 0)) % M
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    src = pid_bh * M * D + slot[:, None] * D + d[None, :]
    dst = pid_bh * R * D + r[:, None] * D + d[None, :]
    load_mask = live[:, None] & dmask[None, :]
    store_mask = (r < R)[:, None] & dmask[None, :]
    kr = tl.load(k_mem + src, mask=load_mask, other=0.0)
    vr = tl.load(v_mem + src, mask=load_mask, other=0.0)
    tl.store(k_out + dst, kr, mask=store_mask)
    tl.store(v_out + dst, vr, mask=store_mask)


# ---- launchers --------------------------------------------------------------------------------

def _cuda_twin(mem):
    """The compiled CUDA twin for a ring whose checks passed. ``RuntimeError`` (from
    ``pmll_lab.cuda_ext``) without a CUDA device; ``ValueError`` naming ``impl`` when the ring is
    not on one (the kernels' device is the CPU: the interpreter was asked for). Both before any
    compile."""
    cuda_ext.require_gpu()
    if mem.k.device.type != "cuda":
        raise ValueError(f"impl: 'cuda' runs on CUDA tensors, but the ring is on {mem.k.device} "
                         f"(the kernels' device is {DEVICE}: PMLL_LAB_DEVICE=cpu or "
                         "TRITON_INTERPRET=1 chose the interpreter); use impl='triton'")
    return cuda_ext.load("pmll_ring")

def check_memory(mem) -> tuple[int, int, int, int]:
    """Check a ring's tensors (``mem.k``, ``mem.v``, ``mem.count``); returns ``(B, H, M, D)``.

    Raises ``ValueError`` naming ``mem``/``mem.k``/``mem.v``/``mem.count``: missing tensors,
    ``k`` not 4-D, not fp32/bf16/fp16, not contiguous or not on the kernels' device
    (``pmll_lab.backend.DEVICE``); ``v`` unlike ``k``; ``count`` not a contiguous int64 ``[B]`` beside them;
    two of them sharing memory; a negative count on the host (free there; on a GPU
    ``pmll_write(validate=True)`` checks it).
    """
    for attr in ("k", "v", "count"):
        if not hasattr(mem, attr):
            raise ValueError(f"mem: expected a ring memory with .k, .v and .count, got "
                             f"{type(mem).__name__} without .{attr}")
    k = _checks.tensor("mem.k", mem.k, ndim=4, dtype=_checks.FLOAT_DTYPES, contiguous=True)
    if k.device.type != DEVICE.type:
        raise ValueError(f"mem.k: on {k.device}, but the kernels run on {DEVICE}")
    batch, heads, capacity, head_dim = k.shape
    if capacity < 1 or head_dim < 1:
        raise ValueError(f"mem.k: capacity and head size must be >= 1, got shape {tuple(k.shape)}")
    _checks.tensor("mem.v", mem.v, shape=tuple(k.shape), dtype=k.dtype, like="mem.k", contiguous=True)
    # the kernels read count[b] at offset b: a strided view would read another sequence's count
    _checks.tensor("mem.count", mem.count, shape=(batch,), dtype=torch.int64, contiguous=True)
    _checks.same_device("mem.k", k, **{"mem.v": mem.v, "mem.count": mem.count})
    # one ring's keys, values and counts are three buffers (a write updates all three)
    _checks.apart({"mem.k": k, "mem.v": mem.v, "mem.count": mem.count})
    if _checks.on_host(mem.count) and bool((mem.count < 0).any()):
        # free on the host: the counts decide the slots read and written
        raise ValueError(f"mem.count: must be >= 0, got {mem.count.tolist()}")
    return batch, heads, capacity, head_dim


def check_write(mem, k_new, v_new, gate=None, *, validate: bool = False) -> tuple[int, int, int, int, int]:
    """The argument checks of ``pmll_write`` (and of ``pmll_lab.pmll.pmll_step``'s write);
    returns ``(B, H, M, D, T)``. Raises ``ValueError`` naming the argument (see ``pmll_write``);
    ``validate=True`` adds the value checks that sync with the device."""
    batch, heads, capacity, head_dim = check_memory(mem)
    _checks.flag("validate", validate)
    dev = mem.k.device
    _checks.tensor("k_new", k_new, ndim=4, shape=(batch, heads, None, head_dim),
                   dtype=mem.k.dtype, like="mem.k", device=dev, last_contiguous=True)
    tokens = k_new.shape[2]
    _checks.tensor("v_new", v_new, ndim=4, shape=(batch, heads, tokens, head_dim),
                   dtype=mem.k.dtype, like="mem.k", device=dev, last_contiguous=True)
    _checks.same_device("mem.k", mem.k, k_new=k_new, v_new=v_new, gate=gate)
    if gate is not None:
        if not isinstance(gate, torch.Tensor) or gate.dim() not in (2, 3):
            got = tuple(gate.shape) if isinstance(gate, torch.Tensor) else type(gate).__name__
            raise ValueError(f"gate: expected None, [B, T] or [B, H, T], got {got}")
        want = (batch, tokens) if gate.dim() == 2 else (batch, heads, tokens)
        _checks.tensor("gate", gate, shape=want, dtype=_checks.FLOAT_DTYPES, device=dev)
    # the ring's keys, values and counts are written while the new rows and gate are read
    _checks.apart({"mem.k": mem.k, "mem.v": mem.v, "mem.count": mem.count},
                  {"k_new": k_new, "v_new": v_new, "gate": gate})
    if validate:
        if gate is not None:
            _checks.range_values("gate", gate, 0.0, 1.0)
        if bool((mem.count < 0).any()):
            raise ValueError(f"mem.count: must be >= 0, got {mem.count.tolist()}")
        _checks.finite_inputs({"k_new": k_new, "v_new": v_new})
        every = torch.arange(batch, device=dev)
        _checks.finite_slots("mem.k", mem.k, every, unit="sequence")
        _checks.finite_slots("mem.v", mem.v, every, unit="sequence")
    if (validate or _checks.on_host(mem.count)) and tokens and bool(
            (mem.count > torch.iinfo(torch.int64).max - tokens).any()):
        # count += T would wrap past int64 (free to check on the host)
        raise ValueError(f"k_new: {tokens} rows past counts of up to {int(mem.count.max())} "
                         f"would overflow mem.count (int64)")
    return batch, heads, capacity, head_dim, tokens


def pmll_write(mem, k_new: torch.Tensor, v_new: torch.Tensor, gate: torch.Tensor | None = None,
               *, validate: bool = False, impl: str = "triton"):
    """Write a segment into the ring, in place (SPEC §1 "write"); returns ``mem``.

    ``k_new, v_new [B, H, T, D]`` in the memory's dtype, on its device, last dim contiguous
    (other strides free). ``gate``: None (``g = 1``: plain write), ``[B, T]`` (one gate per
    token, all heads) or ``[B, H, T]``; fp32/bf16/fp16 values in ``[0, 1]``. Result: exactly the
    rows applied one at a time, ``slot = (count + t) % M; mem[slot] = g*new[t] + (1-g)*mem[slot]``
    (fp32 blend, stored in the memory dtype), ``T > M`` included; then ``count += T``.

    Reads ``min(T, M)`` rows of ``k_new, v_new`` without a gate; with one, all ``T`` rows, the
    gate, and the ``min(T, M)`` slots written (``pmll_lab.pmll.write_bytes``).

    Raises ``ValueError`` naming the argument before launching: wrong rank, batch/heads/head
    size unlike the memory's, dtype, device, strides, gate shape, ``mem.k``, ``mem.v`` and
    ``mem.count`` sharing memory with each other or with ``k_new``, ``v_new``, ``gate``.
    ``validate=True`` also checks (with a device sync; ``pmll_lab._checks``; docs/layouts.md,
    "validate=True") that gate values lie in ``[0, 1]``, that ``k_new``, ``v_new`` and the ring's
    rows are finite, that ``count >= 0`` and that ``count + T`` fits in int64 (counts on the host, a
    CPU run: always).

    ``impl``: ``"triton"`` (these kernels) or ``"cuda"`` (the CUDA C++ twin,
    ``kernels/pmll_ring.cu``: same checks first, same result, ``count += T`` after it on the same
    stream; its blend is fp32 without FMA contraction, so gated results may differ from Triton's
    in the last bit of a rounding, ungated ones are copies and equal). ``impl="cuda"`` without a
    CUDA device raises ``RuntimeError`` (``pmll_lab.cuda_ext``); a bad ``impl``, ``ValueError``.
    """
    _checks.impl("pmll_write", impl)
    check_write(mem, k_new, v_new, gate, validate=validate)
    if impl == "cuda":
        return _cuda_write(mem, k_new, v_new, gate)
    return launch_write(mem, k_new, v_new, gate)


def _cuda_write(mem, k_new: torch.Tensor, v_new: torch.Tensor, gate: torch.Tensor | None):
    """``pmll_write(impl="cuda")`` after its checks: the twin writes, then ``count += T``."""
    twin = _cuda_twin(mem)
    tokens = k_new.shape[2]
    if tokens == 0:
        return mem
    twin.ring_write(mem.k, mem.v, mem.count, k_new, v_new, gate)
    mem.count.add_(tokens)
    return mem


def launch_write(mem, k_new: torch.Tensor, v_new: torch.Tensor, gate: torch.Tensor | None):
    """``pmll_write`` without its checks (the caller ran ``check_write``); returns ``mem``."""
    batch, heads, capacity, head_dim = mem.k.shape
    tokens = k_new.shape[2]
    if tokens == 0:
        return mem
    block_s, block_d = ring_tile(head_dim, min(tokens, capacity))
    grid = (batch * heads, cdiv(min(tokens, capacity), block_s))
    if gate is None:
        g, sg = k_new, (0, 0, 0)                 # never read (HAS_GATE=False)
    elif gate.dim() == 2:
        g, sg = gate, (gate.stride(0), 0, gate.stride(1))
    else:
        g, sg = gate, gate.stride()
    _ring_write_kernel[grid](
        mem.k, mem.v, mem.count, k_new, v_new, g,
        heads, capacity, tokens, head_dim,
        *k_new.stride()[:3], *v_new.stride()[:3], *sg,
        cdiv(tokens, capacity),
        HAS_GATE=gate is not None, BLOCK_S=block_s, BLOCK_D=block_d,
        num_warps=settings.ring().ring_num_warps,
    )
    mem.count.add_(tokens)
    return mem


def pmll_read(mem, t_ctx: int = 0, *, impl: str = "triton") -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's rows in chronological order, right-aligned, plus ``t_ctx`` zero rows (SPEC §1).

    Returns new ``k_out, v_out [B, H, M + t_ctx, D]`` in the memory's dtype: rows
    ``M - length .. M - 1`` are the live rows oldest first, every other row is zero (rows from
    ``M`` on are left for the caller's current-context keys/values). Moves
    ``pmll_lab.pmll.read_bytes`` bytes. ``t_ctx``: an int >= 0 whose outputs fit in the ring
    device's memory. Raises ``ValueError`` naming ``mem``, ``t_ctx`` or ``impl`` before any
    allocation. ``impl``: ``"triton"`` or ``"cuda"`` (the CUDA C++ twin, ``kernels/pmll_ring.cu``;
    a copy, so bitwise the same outputs; ``RuntimeError`` without a CUDA device).
    """
    _checks.impl("pmll_read", impl)
    batch, heads, capacity, head_dim = check_memory(mem)
    t_ctx = _checks.positive_int("t_ctx", t_ctx, minimum=0)
    _checks.fits("t_ctx", 2 * batch * heads * (capacity + t_ctx) * head_dim * mem.k.element_size(),
                 mem.k.device, f"the outputs k_out, v_out [{batch}, {heads}, {capacity} + {t_ctx}, "
                 f"{head_dim}]")
    if impl == "cuda":
        k_out, v_out = _cuda_twin(mem).ring_read(mem.k, mem.v, mem.count, t_ctx)
        return k_out, v_out
    rows = capacity + t_ctx
    k_out = torch.empty(batch, heads, rows, head_dim, dtype=mem.k.dtype, device=mem.k.device)
    v_out = torch.empty_like(k_out)
    if k_out.numel() == 0:
        return k_out, v_out
    block_s, block_d = ring_tile(head_dim, rows)
    grid = (batch * heads, cdiv(rows, block_s))
    ring_read_kernel[grid](
        mem.k, mem.v, mem.count, k_out, v_out,
        heads, capacity, rows, head_dim,
        BLOCK_S=block_s, BLOCK_D=block_d, num_warps=settings.ring().ring_num_warps,
    )
    return k_out, v_out
