"""Public peer implementations the workbench measures against (optional imports).

- flash-linear-attention (PyPI ``fla-core``): ``fused_recurrent_gated_delta_rule``, a Gated
  DeltaNet recurrence over T tokens that keeps no per-row state, so it cannot roll back a
  rejected draft: a *speed* reference for the K-row verify, checked against our float64
  reference before it is timed. Used on a GPU only (on the CPU it runs in the interpreter).
  K-major state ``[B, HV, kd, vd]`` (our ``state_layout="kv"``).
- FlashInfer (PyPI ``flashinfer-python``, read and checked against 0.7.2.post1's
  ``flashinfer/gdn_decode.py``): CuTe-DSL kernels for Hopper and later, GPU only (the ``peers``
  extra; never installed by ``dev``). V-major ("pretranspose") fp32 state pool
  ``[S, HV, vd, kd]`` (our ``state_layout="vk"``) addressed by int32 slot indices:

  ``gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=None,
  output=None, use_qk_l2norm=True, initial_state=None, initial_state_indices=None,
  output_state_indices=None, intermediate_states_buffer=None, disable_state_update=False,
  backend="auto")``: one token (``T = 1``), the state updated in place (pool form:
  ``state=None, initial_state=pool, initial_state_indices=slots``);

  ``gated_delta_rule_mtp(q, k, v, initial_state, initial_state_indices, A_log, a, dt_bias, b,
  scale=None, output=None, intermediate_states_buffer=None, ssm_state_indices=None,
  disable_state_update=None, use_qk_l2norm=True, output_state_indices=None, ...)``: ``T > 1``
  rows (the K-row verify); ``intermediate_states_buffer [B, >=T, HV, vd, kd]`` fp32 receives the
  state after *every* row (``T`` states, the last one the final state), and
  ``disable_state_update=True`` leaves the pool as it was (SGLang's snapshot verify).

  Both take ``q, k [B, T, HK, kd]``, ``v [B, T, HV, vd]`` (bf16/fp16), ``A_log, dt_bias [HV]``
  fp32, ``a, b [B, T, HV]`` (bf16 here), compute the gating in fp32 inside the kernel with
  ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus beta 1, threshold 20: PyTorch's) and
  ``beta = sigmoid(b)``, l2-normalise q and k in the kernel (``x * rsqrt(sum(x*x) + 1e-6)``, as
  SPEC §2) and scale q by ``scale`` (default ``kd**-0.5``); value head ``h`` reads key head
  ``h // (HV // HK)``; the output is written in bf16; ``kd, vd >= 128`` (asserted).

Every helper here returns ``None``/``False`` instead of raising when the peer is not installed
or cannot import on this machine, so notebooks and sweeps run without it.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from collections.abc import Callable
from functools import lru_cache

import torch
import torch.nn.functional as F

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


# ---- FlashInfer ----------------------------------------------------------------------------------

FLASHINFER_MIN_HEAD_DIM = 128
"""FlashInfer 0.7.2's fp32-state GDN paths assert ``kd >= 128`` and ``vd >= 128``."""
FLASHINFER_INPUT_DTYPES = ("bfloat16", "float16")
"""Input dtypes its GDN decode and MTP entry points accept for q, k, v (asserted)."""
FLASHINFER_BF16_STATE_HEAD_DIM = 128
"""Its bf16-state kernels (``gated_delta_rule_decode_pretranspose`` with a bf16 pool: T = 1, or
its bf16 MTP kernel for T > 1 with ``intermediate_states_buffer`` and ``disable_state_update``)
need ``kd = vd = 128`` (0.7.2.post1's dispatch; otherwise it takes its fp32 path and asserts)."""


@lru_cache(maxsize=1)
def flashinfer_gdn() -> tuple[Callable, Callable] | None:
    """FlashInfer's ``(gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp)``, or None
    where flashinfer-python is not installed or does not import on this machine."""
    try:
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp
    except Exception:  # noqa: BLE001 - not installed, or cannot import on this machine
        return None
    # its JIT logs two INFO lines per compiled kernel; keep the reports to the measurements.
    # FlashInfer builds that logger as a Logger subclass outside logging's registry (in
    # flashinfer/jit/core.py), so getLogger("flashinfer.jit") does not reach it.
    logging.getLogger("flashinfer").setLevel(logging.WARNING)
    try:
        from flashinfer.jit import core as fi_jit
        fi_jit.logger.setLevel(logging.WARNING)
    except Exception:  # noqa: BLE001 - another layout of FlashInfer's package: logs stay on
        pass
    return gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp


def raised_inside_flashinfer(exc: BaseException) -> bool:
    """Whether ``exc`` passed through FlashInfer's own code after leaving ours: a frame of its
    traceback below the last frame of ``pmll_lab`` lies in the package that provides
    ``flashinfer_gdn``'s functions (raised there or deeper, in a library it calls). False where
    FlashInfer does not import. Why: a failure of the peer's is a limit of the peer, one of
    ours is a failure."""
    fns = flashinfer_gdn()
    if fns is None or exc.__traceback__ is None:
        return False
    roots = set()
    for fn in fns:
        mod = sys.modules.get(str(getattr(fn, "__module__", "")).split(".")[0])
        dirs = ([os.path.dirname(mod.__file__)] if getattr(mod, "__file__", None)
                else list(getattr(mod, "__path__", [])))       # a namespace package
        roots.update(os.path.abspath(d) + os.sep for d in dirs)
    ours = os.path.dirname(os.path.abspath(__file__)) + os.sep
    files = [os.path.abspath(f.filename) for f in traceback.extract_tb(exc.__traceback__)]
    last_ours = max((i for i, f in enumerate(files) if f.startswith(ours)), default=-1)
    return any(f.startswith(r) for f in files[last_ours + 1:] for r in roots)


def flashinfer_available() -> bool:
    """FlashInfer is measured on a GPU only, where flashinfer-python imports."""
    return DEVICE.type == "cuda" and not INTERPRET and flashinfer_gdn() is not None


def flashinfer_version() -> str:
    """The installed flashinfer-python's version, or "" where it does not import."""
    try:
        import flashinfer

        return str(getattr(flashinfer, "__version__", ""))
    except Exception:  # noqa: BLE001
        return ""


def flashinfer_supports(head_dim: int, dtype: str, state_dtype: str = "float32") -> bool:
    """Whether FlashInfer's GDN kernels take this head size (``kd = vd``), input dtype and state
    dtype (fp32 from ``kd >= 128``; bf16 at ``kd = 128`` only; no fp16 state)."""
    if str(dtype) not in FLASHINFER_INPUT_DTYPES:
        return False
    if str(state_dtype) == "bfloat16":
        return int(head_dim) == FLASHINFER_BF16_STATE_HEAD_DIM
    return str(state_dtype) == "float32" and int(head_dim) >= FLASHINFER_MIN_HEAD_DIM


def flashinfer_status() -> str:
    """One line for a report: ``"FlashInfer <version>"``, ``"FlashInfer: not installed"``, or
    ``"FlashInfer <version>: installed, GPU only (not measured on this device)"``."""
    if flashinfer_gdn() is None:
        return "FlashInfer: not installed"
    ver = flashinfer_version() or "(version unknown)"
    if not flashinfer_available():
        return f"FlashInfer {ver}: installed, GPU only (not measured on this device)"
    return f"FlashInfer {ver}"


def fused_gating(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
                 *, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` from FlashInfer's (and Qwen3-Next's) gating inputs, computed in ``dtype``.

    ``A_log, dt_bias [HV]``, ``a, b [..., HV]`` (any float dtype; converted to ``dtype`` first):
    ``g = -exp(A_log) * softplus(a + dt_bias)`` with PyTorch's softplus (beta 1, threshold 20,
    as FlashInfer's kernels use), ``beta = sigmoid(b)``. float64 for the references, float32
    for our kernels' ``g, beta`` inputs (SPEC §2, "Gating")."""
    x = a.to(dtype) + dt_bias.to(dtype)
    g = -torch.exp(A_log.to(dtype)) * F.softplus(x)
    return g, torch.sigmoid(b.to(dtype))


def _flashinfer_fns() -> tuple[Callable, Callable]:
    fns = flashinfer_gdn()
    if fns is None:
        raise RuntimeError("flashinfer: flashinfer-python does not import on this machine")
    return fns


def _check_pool(state: torch.Tensor, v: torch.Tensor, q: torch.Tensor, slots: torch.Tensor) -> None:
    """The shapes FlashInfer asserts, raised as ``ValueError`` naming the argument."""
    B, K, HV, vd = v.shape
    kd = q.shape[-1]
    # bf16 pools run FlashInfer's bf16-state kernels, which take kd = vd = 128 only
    # (flashinfer_supports; FlashInfer itself asserts otherwise)
    if (state.dim() != 4 or tuple(state.shape[1:]) != (HV, vd, kd)
            or state.dtype not in (torch.float32, torch.bfloat16)):
        raise ValueError(f"state: must be an fp32 or bf16 V-major pool [S, {HV}, {vd}, {kd}], got "
                         f"{tuple(state.shape)} {state.dtype}")
    if slots.shape != (B,) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"state_indices: must be int32/int64 [{B}], got {tuple(slots.shape)} "
                         f"{slots.dtype}")


def flashinfer_decode_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
                             b: torch.Tensor, state: torch.Tensor, state_indices: torch.Tensor,
                             *, scale: float
                             ) -> tuple[Callable[[], object], dict[str, torch.Tensor]]:
    """A zero-argument call of FlashInfer's decode (``gated_delta_rule_decode_pretranspose``,
    one token, fp32 V-major pool updated in place) and its output buffer.

    ``q, k [B, 1, HK, kd]``, ``v [B, 1, HV, vd]`` bf16/fp16; ``A_log, dt_bias [HV]`` fp32;
    ``a, b [B, 1, HV]``; ``state [S, HV, vd, kd]`` fp32, ``state_indices [B]`` int32 (slots).
    A bf16 ``state`` pool (``kd = vd = 128``) runs FlashInfer's bf16-state kernel.
    Inputs are copied to contiguous tensors once (not timed); the output buffer
    ``o [B, 1, HV, vd]`` bf16 is passed in, so a call allocates nothing and can be captured in
    a CUDA graph. Returns ``(run, {"o": o})``. Raises ``RuntimeError`` when flashinfer does not
    import, ``ValueError`` for shapes it would reject."""
    decode, _ = _flashinfer_fns()
    if q.dim() != 4 or q.shape[1] != 1:
        raise ValueError(f"q: must be [B, 1, HK, kd] (one token), got {tuple(q.shape)}")
    _check_pool(state, v, q, state_indices)
    q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
    A_log, dt_bias = A_log.float().contiguous(), dt_bias.float().contiguous()
    o = torch.zeros(v.shape, dtype=torch.bfloat16, device=v.device)

    def run():
        return decode(q, k, v, None, A_log, a, dt_bias, b, scale=scale, output=o,
                      use_qk_l2norm=True, initial_state=state, initial_state_indices=state_indices)

    return run, {"o": o}


def flashinfer_mtp_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
                          b: torch.Tensor, state: torch.Tensor, state_indices: torch.Tensor,
                          *, scale: float, snapshots: bool, frozen: bool,
                          out: torch.Tensor | None = None,
                          intermediate: torch.Tensor | None = None,
                          ) -> tuple[Callable[[], object], dict[str, torch.Tensor | None]]:
    """A zero-argument call of FlashInfer's K-row verify (``gated_delta_rule_mtp``) and its
    output buffers.

    ``q, k [B, K, HK, kd]``, ``v [B, K, HV, vd]`` bf16/fp16, ``K >= 2``; ``A_log, dt_bias [HV]``
    fp32; ``a, b [B, K, HV]``; ``state [S, HV, vd, kd]`` fp32 V-major pool, ``state_indices [B]``
    int32. ``snapshots``: pass ``intermediate_states_buffer [B, K, HV, vd, kd]`` fp32 (the state
    after each of the K rows, row ``K-1``'s being the final state); ``frozen``:
    ``disable_state_update=True`` (the pool is left as it was; with ``snapshots`` this is the
    snapshot verify SGLang runs, without it a verify that cannot roll back nor advance).
    A bf16 ``state`` pool (``kd = vd = 128``) goes through the pretranspose entry point with
    ``T = K`` (its bf16 MTP kernel: ``gated_delta_rule_mtp`` takes fp32 pools only), the buffer
    then in bf16 too.
    ``out`` / ``intermediate``: buffers to write instead of fresh ones (a step loop shares them
    across steps).
    Returns ``(run, {"o": o [B, K, HV, vd] bf16, "intermediate": buffer or None})``; inputs are
    copied to contiguous tensors once (not timed). Raises ``RuntimeError`` when flashinfer does
    not import, ``ValueError`` for shapes it would reject."""
    decode, mtp = _flashinfer_fns()
    if q.dim() != 4 or q.shape[1] < 2:
        raise ValueError(f"q: must be [B, K, HK, kd] with K >= 2, got {tuple(q.shape)}")
    _check_pool(state, v, q, state_indices)
    q, k, v, a, b = (t.contiguous() for t in (q, k, v, a, b))
    A_log, dt_bias = A_log.float().contiguous(), dt_bias.float().contiguous()
    B, K, HV, vd = v.shape
    o = torch.zeros(v.shape, dtype=torch.bfloat16, device=v.device) if out is None else out
    inter = intermediate
    if snapshots and inter is None:
        inter = torch.zeros(B, K, HV, vd, q.shape[-1], dtype=state.dtype, device=v.device)

    if state.dtype == torch.bfloat16:
        def run():
            return decode(q, k, v, None, A_log, a, dt_bias, b, scale=scale, output=o,
                          use_qk_l2norm=True, initial_state=state,
                          initial_state_indices=state_indices,
                          intermediate_states_buffer=inter, disable_state_update=bool(frozen))
    else:
        def run():
            return mtp(q, k, v, state, state_indices, A_log, a, dt_bias, b, scale=scale,
                       output=o, intermediate_states_buffer=inter,
                       disable_state_update=bool(frozen), use_qk_l2norm=True)

    return run, {"o": o, "intermediate": inter}
