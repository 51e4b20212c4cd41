"""What a ``ServingCache`` step checks before any kernel runs (``StepChecks``).

The refusals listed in ``pmll_lab.models.cache``'s docstring, as methods the cache inherits:
slots distinct and in range, slots holding a sequence, no verify waiting for its ``accept``, token
ids of the expected shape inside the vocabulary. Each raises ``ValueError`` naming the argument or
the step and changes nothing.
"""

from __future__ import annotations

import torch

from pmll_lab import _checks


class StepChecks:
    """Checks of a step's inputs against the cache's state; they read the ``ServingCache``
    attributes ``slots`` (``S``), ``_live`` (slots holding a sequence), ``_waiting`` (slots of a
    verify not yet accepted, or None) and ``vocab``."""

    def _check_slots(self, slots) -> list[int]:
        """``slots`` as host ints: distinct, in ``[0, S)``."""
        slots = _checks.int_list("slots", slots)
        if len(set(slots)) != len(slots) or not all(0 <= s < self.slots for s in slots):
            raise ValueError(f"slots: expected distinct slots in [0, {self.slots}), got {slots}")
        return slots

    def _check_live(self, slots: list[int]) -> None:
        dead = [s for s in slots if s not in self._live]
        if dead:
            raise ValueError(f"slots: slot(s) {dead} hold no sequence (never prefilled, or "
                             f"released); prefill(slot, ids) first")

    def _check_idle(self, step: str) -> None:
        """No verify waits for its ``accept`` (every step but ``accept`` needs this)."""
        if self._waiting is not None:
            raise ValueError(f"{step}: the previous verify of slots {self._waiting} was not "
                             f"accepted; call accept(...) first")

    def _check_ids(self, name: str, t, shape: tuple, want: str) -> None:
        """``t``: an int32/int64 tensor of ``shape`` (``None``: any size; ``want`` says it in
        words) whose ids lie in the vocabulary (as ``greedy_generate`` checks its prompts; one
        host read if ``t`` is on the device)."""
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a LongTensor {want}, got {type(t).__name__}")
        if t.dim() != len(shape) or any(w is not None and w != n for w, n in zip(shape, t.shape)):
            raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
        _checks.tensor(name, t, dtype=(torch.int64, torch.int32))
        if t.numel():
            lo, hi = torch.stack(torch.aminmax(t)).tolist()     # one read back, not two
            if lo < 0 or hi >= self.vocab:
                raise ValueError(f"{name}: token ids {lo}..{hi} lie outside the model's "
                                 f"vocabulary [0, {self.vocab})")
