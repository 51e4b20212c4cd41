"""Byte sizes of the GDN buffers and the bytes each launch must move (SPEC §4): one set.

What a buffer holds (per sequence or slot, one layer): ``state_bytes`` (``Hb``, the recurrent
state ``[HV, kd, vd]`` in the state pool's dtype), ``snapshot_bytes`` (the chain's ``K-1``
snapshots, the state's dtype), ``stash_bytes_per_slot`` / ``carry_stash_bytes`` (the carried
state's stash, ``CAP`` rows of ``u, g, k``, fp32 whatever the state's dtype), ``stash_row_bytes``
(one of those rows). What a launch moves, the fewest bytes it must read and write (for GB/s and
the roofline): ``decode_bytes``, ``decodes_bytes``, ``chain_bytes`` and the carried-state verify,
``carry_verify_bytes`` (``carry_bytes`` at ``kd = vd``; beside it the roofline's references at
``kd = vd``: ``fla_bytes``, ``floor_bytes``, ``frozen_bytes``). SGLang's speculative steps
(``pmll_lab.peers_sglang``): held per sequence ``sglang_fold_bytes_per_seq`` (its fold-every-commit
window) and ``sglang_ring_bytes_per_seq`` (its ReplaySSM ring), moved per step
``sglang_fold_step_bytes`` and ``sglang_ring_step_bytes``, from their rows (``sglang_*_row_bytes``).

Every helper checks its arguments and raises ``ValueError`` naming the one at fault: sizes are
ints (numpy ints too) ``>= 1`` (a batch ``>= 0``), dtypes one of fp32, bf16, fp16. Tested against
the bytes real tensors hold (``tests/launchers/test_sizes.py``). Re-exported where they were first defined
(``pmll_lab.gdn``, ``pmll_lab.carry``, ``pmll_lab.experiments.roofline``).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from pmll_lab._checks import FLOAT_DTYPES

CARRY_CAP = 8
"""Stash rows per (layer, slot) of the carried state (SPEC §3b, the seed's ``GDN_CARRY_CAP``;
``pmll_lab.carry.GDN_CARRY_CAP`` is this value)."""

INDEX_BYTES = 4
"""An int32 slot index, pending count or ``engaged`` flag."""


def count(name: str, value, minimum: int = 1) -> int:
    """An int (Python or numpy, not bool) ``>= minimum``, returned as a Python int;
    ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return int(value)


def itemsize(name: str, dtype) -> int:
    """Bytes per element of ``dtype`` (fp32 4, bf16 and fp16 2); ``ValueError`` naming ``name``
    for anything else (another dtype, a string, None)."""
    if dtype not in FLOAT_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in FLOAT_DTYPES)
        raise ValueError(f"{name}: must be one of {names} (a torch.dtype), got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def _heads(num_v_heads, k_dim, v_dim) -> tuple[int, int, int]:
    return (count("num_v_heads", num_v_heads), count("k_dim", k_dim), count("v_dim", v_dim))


def state_bytes(num_v_heads: int, k_dim: int, v_dim: int,
                state_dtype: torch.dtype = torch.float32) -> int:
    """``Hb``: bytes of one sequence's state ``[HV, kd, vd]`` for one layer in ``state_dtype``
    (either layout holds the same bytes)."""
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    return hv * kd * vd * itemsize("state_dtype", state_dtype)


def snapshot_bytes(rows: int, num_v_heads: int, k_dim: int, v_dim: int,
                   state_dtype: torch.dtype = torch.float32) -> int:
    """Snapshot buffer per sequence and layer of a ``rows``-row chain (``rows >= 1``):
    ``(K-1) * Hb``, the snapshots in the state's dtype (``gdn_chain``'s ``intermediate``)."""
    rows = count("rows", rows)
    return (rows - 1) * state_bytes(num_v_heads, k_dim, v_dim, state_dtype)


def snapshot_bytes_per_slot(num_v_heads: int, k_dim: int, v_dim: int, rows: int,
                            state_dtype: torch.dtype = torch.float32) -> int:
    """``snapshot_bytes`` with the carried-state API's argument order (``pmll_lab.carry``):
    what the chain keeps per sequence where the carried state keeps its stash."""
    return snapshot_bytes(rows, num_v_heads, k_dim, v_dim, state_dtype)


def stash_row_bytes(num_v_heads: int, k_dim: int, v_dim: int) -> int:
    """One stash row of every value head: ``u [HV, vd]``, ``g [HV]``, ``k [HV, kd]``, fp32."""
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    return 4 * (hv * vd + hv + hv * kd)


def stash_bytes_per_slot(num_v_heads: int, k_dim: int, v_dim: int,
                         cap: int = CARRY_CAP) -> int:
    """Carried-state stash per (layer, slot), SPEC §3b: ``CAP`` stash rows,
    ``4*CAP*(HV*vd + HV + HV*kd)`` (``GdnCarry.buf``'s row; ``pend`` adds 4 bytes)."""
    return count("cap", cap) * stash_row_bytes(num_v_heads, k_dim, v_dim)


carry_stash_bytes = stash_bytes_per_slot
"""``stash_bytes_per_slot`` by its name in ``pmll_lab.gdn``."""


def row_io_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                 dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None) -> int:
    """Input and output bytes of one row (token) of one sequence: ``q, k [HK, kd]`` and
    ``v [HV, vd]`` in ``dtype``, ``g, beta [HV]`` fp32, and ``o [HV, vd]`` in ``out_dtype``
    (default ``dtype``)."""
    hk = count("num_k_heads", num_k_heads)
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    es = itemsize("dtype", dtype)
    eo = itemsize("out_dtype", dtype if out_dtype is None else out_dtype)
    return (2 * hk * kd + hv * vd) * es + 2 * hv * 4 + hv * vd * eo


def decode_bytes(batch: int, num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                 dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype | None = None,
                 state_dtype: torch.dtype = torch.float32) -> int:
    """One ``gdn_decode`` launch: per sequence ``2*Hb`` (state read and written) plus one row of
    inputs/outputs and its int32 slot index (SPEC §4)."""
    batch = count("batch", batch, minimum=0)
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    return batch * (2 * hb + row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype,
                                          out_dtype) + INDEX_BYTES)


def chain_bytes(batch: int, rows: int, num_k_heads: int, num_v_heads: int, k_dim: int,
                v_dim: int, dtype: torch.dtype = torch.bfloat16,
                out_dtype: torch.dtype | None = None,
                state_dtype: torch.dtype = torch.float32) -> int:
    """One ``gdn_chain`` launch with snapshots: per sequence ``(K+1)*Hb`` (state read, ``K-1``
    snapshots and the final state written) plus ``K`` rows of inputs/outputs and the slot index
    (SPEC §4)."""
    batch, rows = count("batch", batch, minimum=0), count("rows", rows)
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    io = row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype, out_dtype)
    return batch * ((rows + 1) * hb + rows * io + INDEX_BYTES)


def decodes_bytes(batch: int, rows: int, num_k_heads: int, num_v_heads: int, k_dim: int,
                  v_dim: int, dtype: torch.dtype = torch.bfloat16,
                  out_dtype: torch.dtype | None = None,
                  state_dtype: torch.dtype = torch.float32) -> int:
    """``K`` successive ``gdn_decode`` launches: ``K`` times ``decode_bytes``."""
    return count("rows", rows) * decode_bytes(batch, num_k_heads, num_v_heads, k_dim, v_dim,
                                              dtype, out_dtype, state_dtype)


def carry_verify_bytes(pend, write_back, rows: int, num_k_heads: int, num_v_heads: int,
                       k_dim: int, v_dim: int, dtype: torch.dtype = torch.bfloat16,
                       state_dtype: torch.dtype = torch.float32,
                       out_dtype: torch.dtype | None = None, cap: int = CARRY_CAP) -> int:
    """One carried-state verify launch (``gdn_carry_verify``, SPEC §4): per sequence ``Hb``
    read, ``Hb`` written if it writes back, its ``p`` pending stash rows read (folded) and
    ``K`` written, ``K`` rows of inputs/outputs, and three int32 (slot, pend, engaged).

    ``pend``: the sequences' pending counts (ints in ``[0, cap]``, one per sequence: a list or
    an array); ``write_back``: whether each wrote the state back (bools, as many). ``Hb`` in
    ``state_dtype``; the stash rows fp32. ``ValueError`` naming ``pend`` / ``write_back`` for
    entries out of range or a length that differs, as for the sizes."""
    rows = count("rows", rows)
    cap = count("cap", cap)
    pend = np.asarray(pend)
    wb = np.asarray(write_back)
    if pend.ndim != 1 or (pend.size and not np.issubdtype(pend.dtype, np.integer)):
        raise ValueError(f"pend: expected one int per sequence, got {pend.dtype} of shape "
                         f"{pend.shape}")
    if pend.size and (pend.min() < 0 or pend.max() > cap):
        raise ValueError(f"pend: entries must lie in [0, {cap}] (CAP), got range "
                         f"[{pend.min()}, {pend.max()}]")
    flags = wb.dtype == np.bool_ or (np.issubdtype(wb.dtype, np.integer)
                                     and bool(np.isin(wb, (0, 1)).all()))
    if wb.shape != pend.shape or (wb.size and not flags):
        raise ValueError(f"write_back: expected {pend.size} bools (one per sequence, as pend), "
                         f"got {wb.dtype} of shape {wb.shape}")
    B = pend.size
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    row = stash_row_bytes(num_v_heads, k_dim, v_dim)
    io = row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype, out_dtype)
    return int(B * hb + int(wb.sum()) * hb + (int(pend.sum()) + B * rows) * row
               + B * rows * io + 3 * INDEX_BYTES * B)


def carry_bytes(pend, write_back, K: int, HK: int, HV: int, D: int, dtype,
                state_dtype=torch.float32) -> int:
    """``carry_verify_bytes`` for heads of ``kd = vd = D`` (the roofline notebook's shapes; its
    argument names)."""
    return carry_verify_bytes(pend, write_back, K, HK, HV, D, D, dtype, state_dtype)


def fla_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype) -> int:
    """The state read and written once (``2*Hb``) plus ``K`` rows: FLA, a decode at K = 1."""
    io = row_io_bytes(HK, HV, D, D, dtype)
    return count("batch", B, 0) * (2 * state_bytes(HV, D, D) + K * io)


def floor_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype) -> int:
    """The roofline floor of a ``K``-row verify: the state read once, ``K`` stash rows written,
    ``K`` rows of inputs and outputs (no write-back, nothing pending)."""
    row = stash_row_bytes(HV, D, D) + row_io_bytes(HK, HV, D, D, dtype)
    return count("batch", B, 0) * (state_bytes(HV, D, D) + K * row)


def frozen_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype,
                 state_dtype=torch.float32) -> int:
    """A verify that reads the state and writes nothing (FlashInfer's frozen ``mtp``)."""
    io = row_io_bytes(HK, HV, D, D, dtype)
    return count("batch", B, 0) * (state_bytes(HV, D, D, state_dtype) + K * io + 4)


def step_io_bytes(K: int, HK: int, HV: int, D: int, dtype) -> int:
    """One speculative step's rows per sequence: ``K`` rows of ``q, k, v, a, b`` in ``dtype``
    and ``K`` bf16 output rows."""
    i = itemsize("dtype", dtype)
    return count("K", K) * ((2 * HK * D + HV * D + 2 * HV) * i + HV * D * 2)


def carry_step_bytes(K: int, HK: int, HV: int, D: int, dtype, state_dtype, *,
                     fold_frac: float, mean_fill: float, spec_store: bool = False) -> int:
    """A carried-state step (exact form) per sequence and layer: the state read, written back
    on ``fold_frac`` of the steps, ``mean_fill`` pending stash rows read and ``K`` written
    (fp32 ``u, g, k``), and the step's rows; ``spec_store``: the full-acceptance state written
    to the spare slot too, every step."""
    hb = state_bytes(HV, D, D, state_dtype)
    return int(hb * (1 + fold_frac + bool(spec_store))
               + stash_row_bytes(HV, D, D) * (mean_fill + K)
               + step_io_bytes(K, HK, HV, D, dtype))


def ring_step_bytes(K: int, HK: int, HV: int, D: int, dtype, state_dtype, *, fold_frac: float,
                    mean_fill: float, ring_dtype=None) -> int:
    """A ring-form step (SPEC §3d) per sequence and layer: the state read, folded on
    ``fold_frac`` of the steps, ``mean_fill`` ring rows read and ``K`` written (``k`` per key
    head and ``u`` per value head in ``ring_dtype``, default the state's; an fp32 log decay),
    and the step's rows."""
    hb = state_bytes(HV, D, D, state_dtype)
    rs = itemsize("ring_dtype", state_dtype if ring_dtype is None else ring_dtype)
    row = (HK * D + HV * D) * rs + HV * 4
    return int(hb * (1 + fold_frac) + row * (mean_fill + K) + step_io_bytes(K, HK, HV, D, dtype))


def raw_row_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                  dtype: torch.dtype = torch.bfloat16) -> int:
    """One raw row as a step receives it and an exact fold replays it (the ring form with an
    exact fold, ``harness.step_ring_exact_fold``): ``k [HK, kd]``, ``v [HV, vd]`` and the gating
    inputs ``a, b [HV]``, all in the activation ``dtype``."""
    hk = count("num_k_heads", num_k_heads)
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    return (hk * kd + hv * vd + 2 * hv) * itemsize("dtype", dtype)


def snapshot_step_bytes(K: int, HK: int, HV: int, D: int, dtype, state_dtype, *,
                        writes: int, restore_frac: float) -> int:
    """A snapshot step per sequence and layer: the state read, ``writes`` states written (the
    chain's ``K - 1`` snapshots and its final state, or a frozen verify's ``K`` snapshots), the
    restore's two state moves on ``restore_frac`` of the steps, and the step's rows."""
    hb = state_bytes(HV, D, D, state_dtype)
    return int(hb * (1 + writes) + 2 * hb * restore_frac + step_io_bytes(K, HK, HV, D, dtype))


# ---- SGLang's speculative steps (pmll_lab.peers_sglang) --------------------------------------

SGLANG_RING_LAYOUTS = ("compact", "raw")
"""What SGLang's ReplaySSM ring stores per row beside ``d``, the normalised ``k`` and ``g``:
``compact`` the low parts of ``d`` and ``k`` (where the activation dtype is not fp32; its
serving path), ``raw`` the raw ``v``, pre-norm ``k`` and ``beta`` for its exact fold."""

SGLANG_CURSOR_BYTES = 9
"""The ring's cursors per request: ``write_pos``, ``cache_base`` (int32) and ``is_flush`` (int8)."""


def _fraction(name: str, value, maximum: float | None = None) -> float:
    """A float ``>= 0`` (and ``<= maximum``); ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    if not 0.0 <= float(value) <= (float("inf") if maximum is None else maximum):
        bound = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name}: must be >= 0{bound}, got {value}")
    return float(value)


def gated_row_io_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                       dtype: torch.dtype = torch.bfloat16,
                       out_dtype: torch.dtype | None = None) -> int:
    """Input and output bytes of one row of a launcher that forms ``g`` and ``beta`` in the
    kernel (SGLang's, FlashInfer's): ``q, k [HK, kd]``, ``v [HV, vd]`` and the gating inputs
    ``a, b [HV]`` in ``dtype``, ``o [HV, vd]`` in ``out_dtype`` (default ``dtype``)."""
    hk = count("num_k_heads", num_k_heads)
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    es = itemsize("dtype", dtype)
    eo = itemsize("out_dtype", dtype if out_dtype is None else out_dtype)
    return (2 * hk * kd + hv * vd + 2 * hv) * es + hv * vd * eo


def sglang_fold_row_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                          dtype: torch.dtype = torch.bfloat16) -> int:
    """One raw row of SGLang's fold-every-commit window (what its exact folds replay): ``v
    [HV, vd]`` and the pre-norm ``k [HK, kd]`` in the activation ``dtype``, ``g, beta [HV]``
    fp32."""
    hk = count("num_k_heads", num_k_heads)
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    return (hk * kd + hv * vd) * itemsize("dtype", dtype) + 2 * hv * 4


def sglang_history_row_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                             dtype: torch.dtype = torch.bfloat16) -> int:
    """One ring row as SGLang's ReplaySSM verify reads it: ``d [HV, vd]`` and the normalised
    ``k [HK, kd]`` in the activation ``dtype``, ``g [HV]`` fp32."""
    hk = count("num_k_heads", num_k_heads)
    hv, kd, vd = _heads(num_v_heads, k_dim, v_dim)
    return (hk * kd + hv * vd) * itemsize("dtype", dtype) + hv * 4


def sglang_ring_row_bytes(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                          dtype: torch.dtype = torch.bfloat16, layout: str = "compact") -> int:
    """One stored row of SGLang's ReplaySSM ring: the history row
    (``sglang_history_row_bytes``) and, by ``layout`` (``SGLANG_RING_LAYOUTS``), ``compact``:
    the low parts of ``d`` and ``k`` in ``dtype`` unless it is fp32; ``raw``: raw ``v``,
    pre-norm ``k`` in ``dtype`` and ``beta [HV]`` fp32."""
    if layout not in SGLANG_RING_LAYOUTS:
        raise ValueError(f"layout: must be one of {SGLANG_RING_LAYOUTS}, got {layout!r}")
    row = sglang_history_row_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype)
    lows = (int(num_k_heads) * int(k_dim) + int(num_v_heads) * int(v_dim)) * itemsize("dtype",
                                                                                      dtype)
    if layout == "raw":
        return row + lows + int(num_v_heads) * 4
    return row + (0 if dtype == torch.float32 else lows)


def sglang_fold_bytes_per_seq(rows: int, num_k_heads: int, num_v_heads: int, k_dim: int,
                              v_dim: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """What SGLang's fold-every-commit holds per sequence and layer beside the state: a window
    of ``K`` raw rows (``sglang_fold_row_bytes``)."""
    return count("rows", rows) * sglang_fold_row_bytes(num_k_heads, num_v_heads, k_dim, v_dim,
                                                       dtype)


def sglang_ring_bytes_per_seq(length: int, num_k_heads: int, num_v_heads: int, k_dim: int,
                              v_dim: int, dtype: torch.dtype = torch.bfloat16,
                              layout: str = "compact") -> int:
    """What SGLang's ReplaySSM ring holds per sequence and layer beside the state: ``L`` rows
    (``sglang_ring_row_bytes``) and its cursors (``SGLANG_CURSOR_BYTES``, shared by the
    layers but counted here once per layer, as ``pend``)."""
    return (count("length", length) * sglang_ring_row_bytes(num_k_heads, num_v_heads, k_dim,
                                                            v_dim, dtype, layout)
            + SGLANG_CURSOR_BYTES)


def sglang_fold_step_bytes(rows: int, mean_accept: float, num_k_heads: int, num_v_heads: int,
                           k_dim: int, v_dim: int, dtype: torch.dtype = torch.bfloat16,
                           state_dtype: torch.dtype = torch.float32) -> int:
    """The fewest bytes one step of SGLang's fold-every-commit moves per sequence and layer:
    the state read by the verify and read and written by the fold (``3 Hb``), ``K`` raw rows
    written and the ``mean_accept`` accepted ones read back, ``K`` rows of inputs and outputs
    (``gated_row_io_bytes``). ``mean_accept`` in ``[0, K]``."""
    rows = count("rows", rows)
    acc = _fraction("mean_accept", mean_accept, rows)
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    row = sglang_fold_row_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype)
    io = gated_row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype)
    return int(3 * hb + row * (rows + acc) + rows * io)


def sglang_ring_step_bytes(rows: int, fold_frac: float, mean_fill: float, mean_accept: float,
                           num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int,
                           dtype: torch.dtype = torch.bfloat16,
                           state_dtype: torch.dtype = torch.float32,
                           layout: str = "compact") -> int:
    """The fewest bytes one step of SGLang's ReplaySSM ring moves per sequence and layer: the
    verify reads the state and ``mean_fill`` history rows (``sglang_history_row_bytes``) and
    writes ``K`` rows (``sglang_ring_row_bytes``); a fold (``fold_frac`` of the steps) reads
    and writes the state once more and reads its rows, ``mean_accept`` per step on average
    (every committed row is folded once: stored rows, or raw rows for the ``raw`` layout's exact
    fold); ``K`` rows of inputs and outputs. ``fold_frac`` in ``[0, 1]``, ``mean_fill >= 0``,
    ``mean_accept`` in ``[0, K]``."""
    rows = count("rows", rows)
    frac = _fraction("fold_frac", fold_frac, 1.0)
    fill = _fraction("mean_fill", mean_fill)
    acc = _fraction("mean_accept", mean_accept, rows)
    hb = state_bytes(num_v_heads, k_dim, v_dim, state_dtype)
    hist = sglang_history_row_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype)
    row = sglang_ring_row_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype, layout)
    folded = (sglang_fold_row_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype)
              if layout == "raw" else row)
    io = gated_row_io_bytes(num_k_heads, num_v_heads, k_dim, v_dim, dtype)
    return int(hb * (1 + 2 * frac) + hist * fill + row * rows + folded * acc + rows * io)


__all__ = ["CARRY_CAP", "raw_row_bytes", "state_bytes", "snapshot_bytes", "snapshot_bytes_per_slot",
           "stash_row_bytes", "stash_bytes_per_slot", "carry_stash_bytes", "row_io_bytes",
           "decode_bytes", "chain_bytes", "decodes_bytes", "carry_verify_bytes", "carry_bytes",
           "fla_bytes", "floor_bytes", "frozen_bytes", "step_io_bytes", "carry_step_bytes",
           "ring_step_bytes", "snapshot_step_bytes", "SGLANG_RING_LAYOUTS",
           "SGLANG_CURSOR_BYTES", "gated_row_io_bytes", "sglang_fold_row_bytes",
           "sglang_history_row_bytes", "sglang_ring_row_bytes", "sglang_fold_bytes_per_seq",
           "sglang_ring_bytes_per_seq", "sglang_fold_step_bytes", "sglang_ring_step_bytes"]
