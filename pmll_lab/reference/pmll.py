"""float64 references for the PMLL memory ring (SPEC §1), written for clarity, not speed.

The ring state of one layer is ``k_mem, v_mem [B, H, M, D]`` and ``count [B]`` (int64, rows ever
written). Derived: ``length = min(count, M)`` rows are live, ``head = count % M`` is the next slot
written, the oldest live row sits in slot ``(count - length) % M``.

Every function takes tensors of any float dtype and device, computes in float64 on the CPU, and
returns new float64 tensors (CPU); nothing is modified in place. The Triton kernels in
``pmll_lab.ops.pmll.ring`` answer to these functions (tests/pmll/test_pmll.py).
"""

from __future__ import annotations

import torch


def as_f64(t: torch.Tensor) -> torch.Tensor:
    """A detached float64 CPU copy of ``t`` (what every reference computes in)."""
    return t.detach().to("cpu", torch.float64).clone()


def blend(g: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The gated blend of a write (SPEC §1): ``g * new + (1 - g) * old``, float64."""
    return g * new + (1 - g) * old


def ring_write(
    k_mem: torch.Tensor,
    v_mem: torch.Tensor,
    count: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    gate: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write ``T`` rows into the ring, one at a time, in order (SPEC §1 "write").

    ``k_mem, v_mem [B, H, M, D]``, ``count [B]``, ``k_new, v_new [B, H, T, D]``, ``gate`` None
    (``g = 1``), ``[B, T]`` (shared by all heads) or ``[B, H, T]``. For each token ``t``:
    ``slot = (count + t) % M``; ``mem[slot] = g * new[t] + (1 - g) * mem[slot]``. Then
    ``count += T``. ``T > M`` simply wraps more than once. Returns ``(k, v, count)``.
    """
    k, v, n = as_f64(k_mem), as_f64(v_mem), count.detach().to("cpu", torch.int64).clone()
    kn, vn = as_f64(k_new), as_f64(v_new)
    batch, heads, capacity, _ = k.shape
    tokens = kn.shape[2]
    if gate is None:
        g = torch.ones(batch, heads, tokens, dtype=torch.float64)
    elif gate.dim() == 2:
        g = as_f64(gate)[:, None, :].expand(batch, heads, tokens)
    else:
        g = as_f64(gate)
    for b in range(batch):
        for t in range(tokens):
            slot = int((n[b] + t) % capacity)
            gb = g[b, :, t, None]                                   # [H, 1]
            k[b, :, slot] = blend(gb, kn[b, :, t], k[b, :, slot])
            v[b, :, slot] = blend(gb, vn[b, :, t], v[b, :, slot])
    return k, v, n + tokens


def ring_read(
    k_mem: torch.Tensor, v_mem: torch.Tensor, count: torch.Tensor, t_ctx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The memory in chronological order, right-aligned (SPEC §1 "read").

    Returns ``k_out, v_out [B, H, M + t_ctx, D]``: rows ``M - length .. M - 1`` hold the live
    rows oldest first (row ``M - length + i`` is slot ``(count - length + i) % M``), every other
    row (those before, and the ``t_ctx`` rows from ``M`` on) is zero.
    """
    k, v = as_f64(k_mem), as_f64(v_mem)
    batch, heads, capacity, dim = k.shape
    k_out = torch.zeros(batch, heads, capacity + t_ctx, dim, dtype=torch.float64)
    v_out = torch.zeros_like(k_out)
    for b in range(batch):
        n = int(count[b])
        length = min(n, capacity)
        slots = (n - length + torch.arange(length)) % capacity     # oldest ... newest
        k_out[b, :, capacity - length:capacity] = k[b][:, slots]
        v_out[b, :, capacity - length:capacity] = v[b][:, slots]
    return k_out, v_out


def ring_reset(
    k_mem: torch.Tensor, v_mem: torch.Tensor, count: torch.Tensor, seqs=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reset sequences (SPEC §1 "reset"): their rows become zero and their ``count`` 0.

    ``seqs``: None (every sequence), a bool mask ``[B]``, or a list/tensor of sequence indices.
    Returns ``(k, v, count)``.
    """
    k, v, n = as_f64(k_mem), as_f64(v_mem), count.detach().to("cpu", torch.int64).clone()
    batch = k.shape[0]
    if seqs is None:
        chosen = list(range(batch))
    else:
        s = torch.as_tensor(seqs).to("cpu")
        chosen = [int(i) for i in (s.nonzero().flatten() if s.dtype == torch.bool else s.flatten())]
    for b in chosen:
        k[b] = 0
        v[b] = 0
        n[b] = 0
    return k, v, n


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Vanilla causal softmax attention, ``[B, H, T, D]`` each, scale ``D**-0.5``; float64."""
    q, k, v = as_f64(q), as_f64(k), as_f64(v)
    tokens, dim = q.shape[2], q.shape[3]
    scores = q @ k.transpose(-1, -2) * dim ** -0.5
    future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def memory_attention(
    q: torch.Tensor,
    k_ctx: torch.Tensor,
    v_ctx: torch.Tensor,
    k_mem: torch.Tensor | None = None,
    v_mem: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one segment over the ring memory and itself (SPEC §1), float64.

    ``q, k_ctx, v_ctx [B, H, T, D]``; memory ``k_mem, v_mem [B, H, M, D]``, ``count [B]``.
    Query ``i`` of sequence ``b`` sees all ``length[b]`` live memory rows (chronological order
    does not change a softmax, but we gather it that way anyway) and context keys ``0..i``.
    Scale ``D**-0.5``. With no memory (``k_mem is None``) this is ``causal_attention``.
    Returns ``o [B, H, T, D]`` float64. Computed one sequence at a time, plainly.
    """
    if k_mem is None:
        return causal_attention(q, k_ctx, v_ctx)
    q, kc, vc = as_f64(q), as_f64(k_ctx), as_f64(v_ctx)
    batch, heads, tokens, dim = q.shape
    capacity = k_mem.shape[2]
    km, vm = ring_read(k_mem, v_mem, count, 0)                      # [B, H, M, D] chronological
    out = torch.empty_like(q)
    for b in range(batch):
        length = min(int(count[b]), capacity)
        keys = torch.cat([km[b, :, capacity - length:], kc[b]], dim=1)      # [H, L + T, D]
        vals = torch.cat([vm[b, :, capacity - length:], vc[b]], dim=1)
        scores = q[b] @ keys.transpose(-1, -2) * dim ** -0.5                # [H, T, L + T]
        visible = torch.ones(tokens, length + tokens, dtype=torch.bool)
        visible[:, length:] = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
        out[b] = torch.softmax(scores, dim=-1) @ vals
    return out
