"""``StepTimer``: the time of each kernel section of a decode or verify step.

Why its own clock: a step's kernels are asynchronous on a GPU, so the host clock around a launch
measures the launch, not the kernel. CUDA events recorded around each section on the stream the
kernels run on give the GPU time of that section; they are read once per step (one sync, which
the step needs anyway for the host to see the argmax).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch


class StepTimer:
    """Time named sections of a step: ``with timer("gdn_verify"): ...``.

    On a GPU each section records two CUDA events on the current stream (no sync); ``collect()``
    synchronises once and returns the summed milliseconds per name. On the CPU (the Triton
    interpreter) it sums wall-clock time. ``enabled=False`` makes every section free."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled
        self._events: list = []
        self._acc: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        if not self.enabled:
            yield
            return
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._acc[name] += (time.perf_counter() - t0) * 1e3

    def collect(self) -> dict[str, float]:
        """Milliseconds per section since the last call (GPU: one sync), then reset."""
        if self._events:
            torch.cuda.synchronize()
            for name, s, e in self._events:
                self._acc[name] += s.elapsed_time(e)
            self._events.clear()
        out = dict(self._acc)
        self._acc.clear()
        return out
