"""Causal depthwise conv for Gated DeltaNet decode and its carry twin (SPEC §3c).

Qwen3-Next feeds each GDN layer through a depthwise causal conv over the fused ``qkv`` channels
(``dim = 2*HK*kd + HV*vd``, width ``d_conv = 4``), SiLU, and an l2norm of the q and k channels.

Launchers (Triton kernels in ``pmll_lab.ops.conv``; float64 references in
``pmll_lab.reference.conv``):

- ``conv_update``: one token per sequence, window updated in place.
- ``conv_chain``: K tokens per sequence in one launch, optional window after each row (the
  snapshot baseline); bitwise equal to K successive ``conv_update``.
- ``ConvCarry``, ``conv_carry_verify``, ``conv_carry_flush``: the carried-window verify (stash
  the K inputs, shift pending ones in first; eager or lazy write-back) and the L-layer flush.
  ``ConvCarry.like(conv_state)`` builds a carry matching a state (slots, dim, dtype, device).

Bytes helpers: the fewest bytes each launch must move (SPEC §4), for GB/s and roofline plots.
Windows and stash rows are counted in the inputs' dtype, weights once per launch. Sizes and
dtypes are checked as in ``pmll_lab.sizes`` (``ValueError`` naming the argument).
"""

from __future__ import annotations

import numbers

import torch

from pmll_lab.ops.conv.carry import ConvCarry, conv_carry_flush, conv_carry_verify
from pmll_lab.ops.conv.chain import conv_chain, conv_update
from pmll_lab.ops.conv.common import conv_block_config
from pmll_lab.sizes import count, itemsize

__all__ = [
    "conv_update", "conv_chain", "ConvCarry", "conv_carry_verify", "conv_carry_flush",
    "conv_block_config", "qwen3_next_conv_dim", "conv_update_bytes", "conv_chain_bytes",
    "conv_carry_verify_bytes", "conv_carry_flush_bytes",
]


def qwen3_next_conv_dim(num_k_heads: int = 16, num_v_heads: int = 32, k_dim: int = 128,
                        v_dim: int = 128) -> tuple[int, int, int]:
    """``(dim, qk_channels, head_dim)`` of the fused qkv conv: ``dim = 2*HK*kd + HV*vd``
    (Qwen3-Next: 8192), ``qk_channels = 2*HK*kd``, ``head_dim = kd``."""
    return 2 * num_k_heads * k_dim + num_v_heads * v_dim, 2 * num_k_heads * k_dim, k_dim


def _size(dtype, name: str = "dtype") -> int:
    return itemsize(name, dtype)


def _shape(batch, rows, dim, d_conv, state_len) -> int:
    """Checks the sizes (``ValueError`` naming one: ``pmll_lab.sizes.count``); returns the
    window's columns (``d_conv - 1`` when ``state_len`` is None)."""
    count("batch", batch, minimum=0)
    count("rows", rows)
    count("dim", dim)
    count("d_conv", d_conv)
    return max(1, d_conv - 1) if state_len is None else count("state_len", state_len)


def _fraction(name: str, value, hi: float | None = None) -> float:
    """A real ``>= 0`` (``<= hi`` when given): an average count or a probability."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 \
            or (hi is not None and value > hi):
        bound = f"in [0, {hi}]" if hi is not None else ">= 0"
        raise ValueError(f"{name}: must be a number {bound}, got {value!r}")
    return float(value)


def _weights(dim, d_conv, esize, bias):
    return dim * (d_conv + (1 if bias else 0)) * esize


def conv_update_bytes(batch: int, dim: int, *, d_conv: int = 4, state_len: int | None = None,
                      dtype=torch.bfloat16, out_dtype=None, bias: bool = True) -> int:
    """Bytes one ``conv_update`` launch must move: per sequence the window read and written
    (``2 * dim * state_len``), ``x`` read and ``y`` written; the weights once."""
    return conv_chain_bytes(batch, 1, dim, d_conv=d_conv, state_len=state_len, dtype=dtype,
                            out_dtype=out_dtype, bias=bias, intermediate=False)


def conv_chain_bytes(batch: int, rows: int, dim: int, *, d_conv: int = 4,
                     state_len: int | None = None, dtype=torch.bfloat16, out_dtype=None,
                     bias: bool = True, intermediate: bool = True) -> int:
    """Bytes one ``conv_chain`` launch of ``rows`` (K) must move: per sequence the window read,
    the final window written, ``K-1`` intermediate windows written (if kept), K inputs read,
    K outputs written; the weights once. ``K`` successive updates move ``K`` times the
    ``conv_update`` bytes instead."""
    sl = _shape(batch, rows, dim, d_conv, state_len)
    e, eo = _size(dtype), _size(out_dtype or dtype, "out_dtype")
    win = dim * sl * e
    per_seq = 2 * win + (rows - 1) * win * bool(intermediate) + rows * dim * (e + eo)
    return batch * per_seq + _weights(dim, d_conv, e, bias)


def conv_carry_verify_bytes(batch: int, rows: int, dim: int, *, pending: float = 0.0,
                            write_back: float = 0.0, d_conv: int = 4,
                            state_len: int | None = None, dtype=torch.bfloat16, out_dtype=None,
                            bias: bool = True) -> int:
    """Bytes one ``conv_carry_verify`` launch must move: per sequence the window read,
    ``pending`` stash rows read, the window written back with probability ``write_back``,
    K inputs read, K outputs written, K inputs stashed; ``slot_tab``/``pend``/``engaged`` (4 B
    each); the weights once. ``pending`` and ``write_back`` may be averages."""
    sl = _shape(batch, rows, dim, d_conv, state_len)
    pending, write_back = _fraction("pending", pending), _fraction("write_back", write_back, 1)
    e, eo = _size(dtype), _size(out_dtype or dtype, "out_dtype")
    win = dim * sl * e
    per_seq = win * (1 + write_back) + pending * dim * e + rows * dim * (2 * e + eo) + 12
    return int(round(batch * per_seq)) + _weights(dim, d_conv, e, bias)


def conv_carry_flush_bytes(layers: int, batch: int, dim: int, *, pending: float = 1.0,
                           d_conv: int = 4, state_len: int | None = None,
                           dtype=torch.bfloat16) -> int:
    """Bytes one ``conv_carry_flush`` over ``layers`` must move, every slot holding ``pending``
    rows (> 0): window read and written, ``pending`` stash rows read, ``slot_tab``/``pend``."""
    count("layers", layers)
    sl = _shape(batch, 1, dim, d_conv, state_len)
    pending = _fraction("pending", pending)
    e = _size(dtype)
    per = 2 * dim * sl * e + pending * dim * e + 8
    return int(round(layers * batch * per))
