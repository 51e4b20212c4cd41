"""Slot tables of the float64 references, read as the kernels read them (SPEC §2 "Serving
conventions").

A slot of -1 marks a padding lane (a batch padded to a captured graph size, as vLLM and
FlashInfer do): the kernels give it zero outputs and read or write nothing for it, so the
references must too, instead of Python's "last slot" that ``tensor[-1]`` would address.
"""

from __future__ import annotations

import torch

from pmll_lab import _checks

PAD = -1
"""The slot index of a padding lane."""


def slot_list(name: str, slots, batch: int, size: int) -> list[int]:
    """``slots`` (``None``: ``0..batch-1``; else ``batch`` ints or an int tensor) as a list of
    Python ints, each in ``[0, size)`` or ``PAD``. ``ValueError`` naming ``name`` for a wrong
    length, a non-integer entry or any other slot (-2, ``size``, ...)."""
    if slots is None:
        return list(range(batch))
    if isinstance(slots, torch.Tensor):
        if slots.dtype.is_floating_point or slots.dtype.is_complex or slots.dtype == torch.bool:
            raise ValueError(f"{name}: expected integer slots, got {slots.dtype}")
        out = [int(s) for s in slots.reshape(-1).tolist()]
    else:
        out = _checks.int_list(name, slots)
    if len(out) != batch:
        raise ValueError(f"{name}: expected {batch} entries (one per sequence), got {len(out)}")
    bad = [s for s in out if s != PAD and not 0 <= s < size]
    if bad:
        raise ValueError(f"{name}: entries must lie in [0, {size}) or be -1 (a padding lane), "
                         f"got {bad[0]}")
    return out
