"""FlashInfer's carried-state ("ReplaySSM") kernels as peers (GPU only, optional import).

FlashInfer 0.7.2.post1 ships two Hopper kernels of the design our ring form follows (SPEC §3d),
read from its module docstrings (``flashinfer/gdn_kernels/gdn_decode_bf16_wy_ucache*.py``):

- ``gated_delta_rule_mtp_ucache_flush``: one verify of ``T`` rows per request on a bf16 V-major
  pool ``[pool, HV, V, K]``, ``K = V = 128``, ``T`` in {4, 8}; reads the request's history
  window ``[cache_base, cache_base + hist_len)`` of a 32-row ring (``k_cache [pool, HK, 32, K]``,
  ``u_cache [pool, HV, 32, V]`` bf16, ``g_cache [pool, HV, 32]`` fp32: normalised keys,
  corrections, cumulative log decay), appends the ``T`` new rows past it, and where
  ``hist_len >= flush_min`` (default ``16 - T + 1``) first folds the window into the state.
  The cursor commit is the caller's: folded requests ``base = (base + len) & 31, len = a``,
  others ``len += a`` (``replayssm_commit`` here, one launch).
- ``gated_delta_rule_mtp_ucache``: the verify alone on a 16-row flat ring (no fold, no base).

Both take the gating inputs ``A_log, dt_bias [HV]`` (cast to bf16 by FlashInfer and cached),
``a, b [B, T, HV]`` bf16, l2-normalise q and k in the kernel, and write bf16 outputs
``[B, T, HV, V]``. ``hist_len`` and ``cache_base`` are per request ``[B]`` int32. Every helper
returns ``None``/``False`` where FlashInfer does not import, so sweeps run without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from pmll_lab.ops.host import cdiv
from pmll_lab.peers import flashinfer_available

REPLAYSSM_RING_SLOTS = 32
"""Physical rows of FlashInfer's rotating ring (``RING_SLOTS``)."""
REPLAYSSM_WINDOW = 16
"""Rows of history its kernels read at most (``W_RING``)."""
REPLAYSSM_ROWS = (4, 8)
"""Draft rows per verify its kernels take."""
REPLAYSSM_HEAD_DIM = 128
"""``K = V`` its kernels require."""


@lru_cache(maxsize=1)
def flashinfer_replayssm() -> tuple[Callable, Callable] | None:
    """``(gated_delta_rule_mtp_ucache_flush, gated_delta_rule_mtp_ucache)`` or None."""
    try:
        from flashinfer.gdn_kernels import (gated_delta_rule_mtp_ucache,
                                            gated_delta_rule_mtp_ucache_flush)
    except Exception:  # noqa: BLE001 - not installed, or cannot import on this machine
        return None
    if gated_delta_rule_mtp_ucache_flush is None or gated_delta_rule_mtp_ucache is None:
        return None
    return gated_delta_rule_mtp_ucache_flush, gated_delta_rule_mtp_ucache


def replayssm_supports(head_dim: int, rows: int, dtype: str, state_dtype: str) -> bool:
    """Whether FlashInfer's ReplaySSM kernels take this shape: ``kd = vd = 128``, ``T`` in
    {4, 8}, bf16 inputs and a bf16 state pool."""
    return (int(head_dim) == REPLAYSSM_HEAD_DIM and int(rows) in REPLAYSSM_ROWS
            and str(dtype) == "bfloat16" and str(state_dtype) == "bfloat16")


def replayssm_available() -> bool:
    """On a GPU where FlashInfer imports and ships the ReplaySSM kernels."""
    return flashinfer_available() and flashinfer_replayssm() is not None


@dataclass(eq=False)
class ReplaySSMRing:
    """FlashInfer's ring for ``pool`` slots and ``B`` requests, zero-initialised (its contract):
    ``k [pool, HK, 32, kd]``, ``u [pool, HV, 32, vd]`` bf16, ``g [pool, HV, 32]`` fp32,
    ``hist_len, cache_base [B]`` int32."""

    k: torch.Tensor
    u: torch.Tensor
    g: torch.Tensor
    hist_len: torch.Tensor
    cache_base: torch.Tensor

    @classmethod
    def empty(cls, pool, batch, num_k_heads, num_v_heads, k_dim, v_dim, device):
        ns = REPLAYSSM_RING_SLOTS
        z = lambda *s, dt=torch.bfloat16: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
        return cls(k=z(pool, num_k_heads, ns, k_dim), u=z(pool, num_v_heads, ns, v_dim),
                   g=z(pool, num_v_heads, ns, dt=torch.float32),
                   hist_len=z(batch, dt=torch.int32), cache_base=z(batch, dt=torch.int32))

    @property
    def bytes_per_slot(self) -> int:
        return (self.k[0].numel() + self.u[0].numel()) * 2 + self.g[0].numel() * 4 + 8


def replayssm_runner(q, k, v, A_log, a, dt_bias, b, state, slots, ring: ReplaySSMRing, *,
                     scale: float, flush_min: int | None = None, out=None):
    """A zero-argument call of ``gated_delta_rule_mtp_ucache_flush`` (no commit) on these
    buffers, and its output ``o [B, T, HV, vd]`` bf16 (``out`` when given). Inputs as the
    module docstring; ``slots [B]`` int32. Raises ``RuntimeError`` where FlashInfer does not
    import."""
    fns = flashinfer_replayssm()
    if fns is None:
        raise RuntimeError("flashinfer: the ReplaySSM kernels do not import on this machine")
    flush = fns[0]
    q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
    o = torch.zeros(v.shape, dtype=torch.bfloat16, device=v.device) if out is None else out

    def run():
        return flush(A_log, a, dt_bias, q=q, k=k, v=v, b=b, initial_state_source=state,
                     initial_state_indices=slots, scale=scale, output=o, k_cache=ring.k,
                     u_cache=ring.u, g_cache=ring.g, hist_len=ring.hist_len,
                     cache_base=ring.cache_base, flush_min=flush_min,
                     restart_hist_on_flush=False)

    return run, o


@triton.jit
def _replayssm_commit_kernel(len_ptr, base_ptr, acc_ptr, B, flush_min, NS: tl.constexpr,
                             BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < B
    n = tl.load(len_ptr + offs, mask=m, other=0)
    base = tl.load(base_ptr + offs, mask=m, other=0)
    a = tl.load(acc_ptr + offs, mask=m, other=0).to(tl.int32)
    folded = n >= flush_min
    tl.store(len_ptr + offs, tl.where(folded, a, n + a), mask=m)
    tl.store(base_ptr + offs, tl.where(folded, (base + n) % NS, base), mask=m)


def replayssm_commit(ring: ReplaySSMRing, accepted: torch.Tensor, flush_min: int) -> None:
    """FlashInfer's caller-owned cursor commit after ``ucache_flush``, in one launch on the
    device: requests with ``hist_len >= flush_min`` (those the kernel folded)
    ``base = (base + len) & 31, len = a``, the others ``len += a`` (``accepted [B]`` int32)."""
    B = ring.hist_len.shape[0]
    _replayssm_commit_kernel[(cdiv(B, 128),)](ring.hist_len, ring.cache_base, accepted, B,
                                              int(flush_min), NS=REPLAYSSM_RING_SLOTS,
                                              BLOCK=128)


def replayssm_state(state_v, ring: ReplaySSMRing, request: int, slot: int) -> torch.Tensor:
    """Float64 ``H_P [HV, kd, vd]`` (K-major) that request ``request``'s ring means over its
    slot's V-major bf16 state: ``e^{G_{P-1}} S0 + sum_j e^{G_{P-1}-G_j} k_j u_j^T``."""
    P = int(ring.hist_len[request])
    base = int(ring.cache_base[request])
    H = state_v[slot].double().transpose(-1, -2).cpu()
    if P == 0:
        return H
    rows = [(base + i) % REPLAYSSM_RING_SLOTS for i in range(P)]
    HV, HK = ring.u.shape[1], ring.k.shape[1]
    G = ring.g[slot].double().cpu()
    kk = ring.k[slot].double().cpu().repeat_interleave(HV // HK, 0)
    uu = ring.u[slot].double().cpu()
    last = G[:, rows[-1]]
    H = torch.exp(last)[:, None, None] * H
    for j in rows:
        w = torch.exp(last - G[:, j])
        H = H + w[:, None, None] * kk[:, j, :, None] * uu[:, j, None, :]
    return H
