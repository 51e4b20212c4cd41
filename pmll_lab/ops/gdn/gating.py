"""Qwen3-Next's gating, alone (``gdn_gating``) or fused into the GDN kernels (SPEC §2 "Gating").

A Qwen3-Next GDN layer gives per value head ``A_log [HV]`` and ``dt_bias [HV]`` (parameters) and
per token ``a, b [B, (K,) HV]`` (projections); the recurrence takes ``g = -exp(A_log) *
softplus(a + dt_bias)`` (PyTorch's softplus, threshold 20) and ``beta = sigmoid(b)``. FLA, SGLang
and FlashInfer compute these inside their decode / verify kernels: one launch and two
``[B, (K,) HV]`` fp32 tensors fewer. Every GDN launcher here takes either ``g, beta`` or, with
``g=None, beta=None``, the keywords ``A_log=, a=, dt_bias=, b=``; the kernels then compute the
gates per row with ``pmll_lab.ops.gdn.recurrence.gdn_gate``, the same ``@triton.jit`` code
``gdn_gating``'s kernel runs, so the fused launch gives the bits of ``gdn_gating`` followed by
the unfused launch, on either backend.

- ``split_gating``: which form a call uses, with errors naming the argument for a mix or a
  missing one.
- ``check_gating``: shapes, dtypes, devices of ``A_log, a, dt_bias, b``.
- ``gdn_gating``: the gates as fp32 tensors (one small Triton kernel).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.ops.gdn.recurrence import EXACT_LAUNCH, gdn_gate
from pmll_lab.ops.host import next_power_of_2
from pmll_lab.ops.launch import device_guard

GATING_NAMES = ("A_log", "a", "dt_bias", "b")


class Gating(NamedTuple):
    """The gating inputs of a fused launch: ``A_log, dt_bias [HV]``, ``a, b [B, (K,) HV]``."""

    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor


def split_gating(g, beta, A_log=None, a=None, dt_bias=None, b=None):
    """``(g, beta, None)`` for a call with gates, ``(a, b, Gating)`` for one with the gating
    inputs (the kernels read ``a, b`` where they would read ``g, beta``).

    Raises ``ValueError`` naming the argument: both forms mixed, ``g`` without ``beta`` (or the
    reverse), some of ``A_log, a, dt_bias, b`` missing, or neither form given."""
    fused = {n: t for n, t in zip(GATING_NAMES, (A_log, a, dt_bias, b)) if t is not None}
    if fused and (g is not None or beta is not None):
        name = next(iter(fused))
        raise ValueError(f"{name}: pass either g, beta or A_log, a, dt_bias, b (the gating "
                         "computed in the kernel), not both")
    if fused:
        missing = [n for n in GATING_NAMES if n not in fused]
        if missing:
            raise ValueError(f"{missing[0]}: required with {', '.join(fused)} (the gating "
                             "computed in the kernel needs A_log, a, dt_bias and b)")
        return a, b, Gating(A_log, a, dt_bias, b)
    if g is None and beta is None:
        raise ValueError("g: required (fp32 log decays), or pass A_log=, a=, dt_bias=, b= to "
                         "compute the gating in the kernel")
    if g is None or beta is None:
        raise ValueError(f"{'g' if g is None else 'beta'}: required with "
                         f"{'beta' if g is None else 'g'}")
    return g, beta, None


def gate_inputs(g, beta, gating: Gating | None) -> dict:
    """The gate tensors a launch reads, by the names its caller passed: ``{"g", "beta"}``, or
    ``{"A_log", "a", "dt_bias", "b"}`` with the gating computed in the kernel (``split_gating``
    returned ``a, b`` as ``g, beta`` then). For the launchers' aliasing checks
    (``pmll_lab._checks.apart``)."""
    if gating is None:
        return {"g": g, "beta": beta}
    return dict(gating._asdict())


def gate_groups(g, beta, gating: Gating | None) -> tuple[dict, dict]:
    """``validate=True``'s finite rule (``pmll_lab._checks.finite_inputs``) over a launch's gate
    tensors: ``(per-lane, per-head)`` dicts by the caller's names. ``g`` is left to its range
    check (``[-inf, 0]``: ``-inf`` is a row that forgets the history)."""
    if gating is None:
        return {"beta": beta}, {}
    return {"a": gating.a, "b": gating.b}, {"A_log": gating.A_log, "dt_bias": gating.dt_bias}


def check_gating(gating: Gating, lead: tuple, num_v_heads: int, input_dtype: torch.dtype,
                 device: torch.device) -> None:
    """``A_log, dt_bias [HV]`` (fp32, bf16 or fp16, contiguous) and ``a, b [*lead, HV]`` (the
    inputs' dtype or fp32, last dim contiguous), all on ``device``. ``ValueError`` naming the
    argument otherwise."""
    for name in ("A_log", "dt_bias"):
        _checks.tensor(name, getattr(gating, name), shape=(num_v_heads,),
                       dtype=_checks.FLOAT_DTYPES, device=device, contiguous=True)
    for name in ("a", "b"):
        _checks.tensor(name, getattr(gating, name), shape=(*lead, num_v_heads),
                       dtype=(input_dtype, torch.float32), device=device, last_contiguous=True)


@triton.jit
def gdn_gating_kernel(A_log, a, dt_bias, b, g, beta, HV, a_b, a_t, b_b, b_t, o_b, o_t,
                      BH: tl.constexpr):
    """Program ``(i, t)``: the ``HV`` gates of row ``t`` of sequence ``i`` (``gdn_gate``).

    ``A_log, dt_bias [HV]`` and ``a, b [B, K, HV]`` (last dim contiguous, strides ``a_b, a_t``,
    ``b_b, b_t``) fp32/bf16/fp16, read as fp32; writes ``g, beta [B, K, HV]`` fp32 (strides
    ``o_b, o_t``); ``BH >= HV`` a power of two; grid ``(B, K)``. Launched by ``gdn_gating``
    after its checks (a kernel raises nothing); public for the sm_90 compile check."""
    i = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    h = tl.arange(0, BH)
    m = h < HV
    al = tl.load(A_log + h, mask=m, other=0.0).to(tl.float32)
    dt = tl.load(dt_bias + h, mask=m, other=0.0).to(tl.float32)
    av = tl.load(a + i * a_b + t * a_t + h, mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b + i * b_b + t * b_t + h, mask=m, other=0.0).to(tl.float32)
    gv, bev = gdn_gate(al, av, dt, bv)
    tl.store(g + i * o_b + t * o_t + h, gv, mask=m)
    tl.store(beta + i * o_b + t * o_t + h, bev, mask=m)


def gdn_gating(A_log, a, dt_bias, b, *, impl="triton") -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's gates: ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus with PyTorch's
    threshold 20), ``beta = sigmoid(b)``, computed in fp32.

    Args:
        A_log, dt_bias: ``[HV]`` fp32, bf16 or fp16, contiguous (the layer's parameters).
        a, b: ``[B, HV]`` (decode) or ``[B, K, HV]`` (K rows), fp32, bf16 or fp16, last dim
            contiguous, any other strides (views of a fused projection buffer).

    Returns ``(g, beta)``, fp32, contiguous, of ``a``'s shape: the inputs of every GDN launcher.
    Passing ``A_log=, a=, dt_bias=, b=`` to a launcher instead computes them in its kernel with
    the same code (``pmll_lab.ops.gdn.recurrence.gdn_gate``): the same bits. ``impl``:
    ``"triton"`` only (no CUDA twin). Raises ``ValueError`` naming the argument. Source:
    Qwen3-Next (HF transformers), FLA and FlashInfer's fused gates; float64 reference
    ``pmll_lab.reference.gdn.gdn_gating_ref``.
    """
    _checks.impl("gdn_gating", impl)
    _checks.tensor("a", a, dtype=_checks.FLOAT_DTYPES, last_contiguous=True)
    if a.dim() not in (2, 3):
        raise ValueError(f"a: expected [B, HV] or [B, K, HV], got shape {tuple(a.shape)}")
    if a.device.type != DEVICE.type:
        raise ValueError(f"a: on {a.device}, but kernels run on {DEVICE} "
                         "(pmll_lab.backend.DEVICE)")
    HV = a.shape[-1]
    _checks.tensor("b", b, shape=tuple(a.shape), dtype=_checks.FLOAT_DTYPES, device=a.device,
                   last_contiguous=True)
    check_gating(Gating(A_log, a, dt_bias, b), tuple(a.shape[:-1]), HV, a.dtype, a.device)
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if g.numel() == 0:
        return g, beta
    a3, b3, g3, beta3 = (t if t.dim() == 3 else t[:, None] for t in (a, b, g, beta))
    B, K = a3.shape[:2]
    with device_guard(a):
        gdn_gating_kernel[(B, K)](A_log, a3, dt_bias, b3, g3, beta3, HV,
                                  a3.stride(0), a3.stride(1), b3.stride(0), b3.stride(1),
                                  g3.stride(0), g3.stride(1), BH=next_power_of_2(HV),
                                  **EXACT_LAUNCH)
    return g, beta

