"""Launch plans: one Triton launch with every argument bound once, replayed with a lean call.

A decode step at small batch is host-bound: on the H200 host (2026-11-29) a ``gdn_decode`` call
at B=1 costs ~30-80 µs as ``do_bench`` times it against ~4 µs of GPU time, spent in our argument
checks and in Triton's ``JITFunction.run`` (binding ~40 arguments, computing the specialisation
key, the cache lookup). Serving engines avoid both by fixing their buffers (the inputs of step
``n+1`` are written into the tensors step ``n`` read) and capturing CUDA graphs; FlashInfer's
"plan, then run" wrappers are the same idea for attention. ``LaunchPlan`` is that for one
Triton kernel: the first call launches through Triton (compiling if needed) and keeps the
compiled kernel; every later call goes straight to the compiled kernel's launcher with the
argument tuple built once. The plan is bound to the buffers, not their contents: write new
values into the same tensors between calls. Reusing the compiled kernel is valid because every
argument is the same object: the pointers' alignment and the integers' specialisation
(divisibility by 16, equality to 1), which select the compiled variant, cannot change.

On the CPU interpreter, or with a Triton launch hook set (profilers), or when called with
another device current than the plan's, a call goes through Triton's normal path. The CPU tests
(tests/launchers/test_launch.py) check the plans' results on that path and the direct call's arguments
against a stand-in compiled kernel; the direct path's results are checked bitwise on the GPU by
the roofline notebook's B=1 rows (measured: reports/perf-notes-archive.md v9).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from pmll_lab.backend import INTERPRET


def device_guard(t: torch.Tensor):
    """The context to launch a kernel on ``t``'s device in: ``torch.cuda.device(t.device)`` for a
    CUDA tensor, else a no-op context (the CPU interpreter). Why: Triton launches on the
    current device, and a tensor on another GPU than the current one would be read from the
    wrong device. ``t``: any tensor (only its ``device`` is read); raises nothing itself."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


class LaunchPlan:
    """``kernel[grid](*args, **kwargs)`` bound once; ``plan()`` launches it and returns
    ``outputs``.

    ``kernel``: a ``@triton.jit`` function; ``grid``: a tuple of 1-3 ints; ``args``: positional
    arguments (tensors, ints, floats) in the kernel's parameter order; ``kwargs``: the remaining
    parameters by name (constexprs) plus launch options (``num_warps``, ``num_stages``);
    ``outputs``: what a call returns (the output tensors the launch writes); ``device``: the
    tensors' device (the first launch runs with it current; call the plan with it current, the
    default on one GPU). ``kernel=None`` makes a plan that launches nothing (an empty batch).
    Raises ``ValueError`` when a kernel parameter is neither in ``args`` nor in ``kwargs``.
    """

    def __init__(self, kernel, grid: Sequence[int], args: Sequence, kwargs: dict, outputs=None,
                 device=None):
        self.kernel, self.grid = kernel, tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.args, self.kwargs, self.outputs = tuple(args), dict(kwargs), outputs
        self.device = device
        params = list(getattr(kernel, "arg_names", None) or [])   # JITFunction and interpreter
        missing = [n for n in params[len(self.args):] if n not in self.kwargs]
        if missing:
            raise ValueError(f"kwargs: kernel {getattr(kernel, '__name__', kernel)} parameters "
                             f"{missing} are given neither positionally nor by name")
        # every parameter's value in declaration order: what Triton's launcher receives
        self._bound = self.args + tuple(self.kwargs[n] for n in params[len(self.args):])
        self._compiled = None
        self._device_index = None

    @property
    def direct(self) -> bool:
        """True once calls bypass Triton's ``JITFunction.run`` (after the first GPU launch)."""
        return self._compiled is not None

    def __call__(self):
        if self.kernel is None:
            return self.outputs
        if (self._compiled is not None and no_launch_hooks()
                and self._current_device() == self._device_index):
            c = self._compiled
            c.run(*self.grid, self._get_stream(self._device_index), c.function,
                  c.packed_metadata, None, None, None, *self._bound)
            return self.outputs
        on_gpu = self.device is not None and getattr(self.device, "type", None) == "cuda"
        if on_gpu:
            with torch.cuda.device(self.device):
                compiled = self.kernel[self.grid](*self.args, **self.kwargs)
                self._remember(compiled)
        else:
            self.kernel[self.grid](*self.args, **self.kwargs)
        return self.outputs

    def _remember(self, compiled) -> None:
        """Keep the compiled kernel and the device it was loaded on (called with that device
        current): later calls on that device go straight to its launcher; a call made with
        another device current takes Triton's path under a device guard."""
        if INTERPRET or compiled is None or not hasattr(compiled, "packed_metadata"):
            return
        from triton.runtime.driver import driver

        self._current_device = driver.active.get_current_device
        self._get_stream = driver.active.get_current_stream
        self._device_index = self._current_device()
        self._compiled = compiled


def no_launch_hooks() -> bool:
    """No profiler or tool has registered a Triton launch hook. Triton 3.6 keeps them as
    ``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``, ``HookChain`` objects whose
    ``calls`` list is empty when unused (older versions: ``None``). Returns ``False`` when the
    hooks cannot be read (no ``triton.knobs``); raises nothing. Why: ``LaunchPlan``'s direct
    path skips the hooks, so it is taken only while this is ``True``."""
    rt = _knobs.runtime if _knobs is not None else None
    if rt is None:
        return False
    return not (_hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook))


def _hooked(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - Triton without knobs: always Triton's own path
    _knobs = None
