"""Public peer implementations the workbench measures against (optional imports).

- flash-linear-attention (PyPI ``fla-core``): ``fused_recurrent_gated_delta_rule``, a Gated
  DeltaNet recurrence over T tokens that keeps no per-row state, so it cannot roll back a
  rejected draft: a *speed* reference for the K-row verify, checked against our float64
  reference before it is timed. Used on a GPU only (on the CPU it runs in the interpreter).

Every helper here returns ``None``/``False`` instead of raising when the peer is not installed
or cannot import on this machine, so notebooks and sweeps run without it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch

from pmll_lab.backend import DEVICE, INTERPRET


@lru_cache(maxsize=1)
def fla_fused_recurrent() -> Callable | None:
    """FLA's ``fused_recurrent_gated_delta_rule``, or None where fla-core does not import."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 - not installed, or cannot import on this machine
        return None
    return fused_recurrent_gated_delta_rule


def fla_available() -> bool:
    """FLA is measured on a GPU only, where fla-core imports."""
    return DEVICE.type == "cuda" and not INTERPRET and fla_fused_recurrent() is not None


def fla_supports_gva() -> bool:
    """Whether the installed FLA takes fewer q/k heads than v heads (its docstring documents GVA,
    as fla-core 0.6's does). Otherwise ``fla_runner`` expands q and k with ``repeat_interleave``."""
    fn = fla_fused_recurrent()
    return fn is not None and "GVA" in (fn.__doc__ or "")


def fla_version() -> str:
    try:
        import fla

        return str(getattr(fla, "__version__", ""))
    except Exception:  # noqa: BLE001
        return ""


def fla_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor, initial_state: torch.Tensor, *, scale: float
               ) -> tuple[Callable[[], tuple[torch.Tensor, torch.Tensor]], str]:
    """A zero-argument call of FLA's fused recurrent kernel over K rows, and how GVA was handled.

    ``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]``, ``g, beta [B, K, HV]`` fp32,
    ``initial_state [B, HV, kd, vd]`` fp32 (FLA's layout, the same as ours). The call passes
    keyword arguments (``use_qk_l2norm_in_kernel=True``, ``output_final_state=True``) and returns
    ``(o [B, K, HV, vd], final_state [B, HV, kd, vd])``. GVA: ``"native"``, or
    ``"repeat_interleave"`` when q and k were expanded to ``HV`` heads beforehand (not timed).
    Raises ``RuntimeError`` when fla-core does not import.
    """
    fn = fla_fused_recurrent()
    if fn is None:
        raise RuntimeError("fla_fused_recurrent: fla-core does not import on this machine")
    HK, HV = q.shape[-2], v.shape[-2]
    gva = "native"
    if HV != HK and not fla_supports_gva():
        q = q.repeat_interleave(HV // HK, dim=-2)
        k = k.repeat_interleave(HV // HK, dim=-2)
        gva = "repeat_interleave"

    def run():
        return fn(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                  output_final_state=True, use_qk_l2norm_in_kernel=True)

    return run, gva
