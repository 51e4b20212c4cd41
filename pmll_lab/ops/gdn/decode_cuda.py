"""``gdn_decode(impl="cuda")`` and ``gdn_chain(impl="cuda")``: the CUDA C++ twins of the decode
(``kernels/gdn_decode.cu``) and of the chain with snapshots (``kernels/gdn_chain.cu``) on a
V-major state, launched after the Triton launchers' own checks (SPEC §2, §3a).

The decode twin computes the same token (in-kernel gating and l2norm, padding lanes of slot -1,
``out_state_indices``, fp32/bf16/fp16 state rounded once when stored) with a group of 8 lanes
per value row (``kernels/gdn_decode.cuh``); its sums over keys run in another order than the Triton kernel's, so it answers to the
float64 reference within the decode's tolerance, not bitwise to Triton. The chain twin runs
the decode twin's per-token code (``kernels/gdn_row.cuh``) on each of the ``K`` rows, the state
row kept in registers and rounded to the state's dtype after every row: outputs, snapshots and
final state are bitwise ``K`` successive decode-twin launches (SPEC §2, "Exactness", within
the CUDA path; not bitwise the Triton chain). V-major states (``state_layout="vk"``) and
``kd <= 256`` only: anything else is a ``ValueError`` naming ``impl``. Without a CUDA device:
``RuntimeError`` from ``pmll_lab.cuda_ext``, before compiling.
"""

from __future__ import annotations

import torch

from pmll_lab import cuda_ext

MAX_KD = 256
"""Keys per state row the twins hold (8 per lane of a warp; ``kGdnMaxKd`` in the header)."""


def check_cuda(state, kd: int, layout: str, what: str = "decode") -> None:
    """What the twin of ``what`` (``"decode"`` or ``"chain"``) takes beyond its launcher's
    checks: ``ValueError`` naming ``impl``."""
    if layout != "vk":
        raise ValueError(f"impl: the CUDA twin of the {what} takes V-major states only "
                         f"(state_layout='vk'), got state_layout={layout!r}")
    if kd > MAX_KD:
        raise ValueError(f"impl: the CUDA twin of the {what} takes kd <= {MAX_KD}, got kd={kd}")


def module(state):
    """The compiled GDN twins (decode, chain, carried-state verify and flush: one module),
    ``RuntimeError`` without a GPU, then ``ValueError`` naming ``impl`` for a state that is not
    on a CUDA device."""
    cuda_ext.require_gpu()
    if state.device.type != "cuda":
        raise ValueError(f"impl: 'cuda' runs on CUDA tensors, but the state is on {state.device}; "
                         "use impl='triton'")
    return cuda_ext.load("gdn_decode")


def _scale(scale, kd: int) -> float:
    return float(kd ** -0.5 if scale is None else scale)


def launch(state, q, k, v, g, beta, o, gating, state_indices, out_state_indices, scale,
           use_qk_l2norm, kd: int) -> torch.Tensor:
    """Run the decode twin into ``o`` (``gdn_decode`` allocated it) and return ``o``. ``g, beta``
    are ``a, b`` when ``gating`` is given (``split_gating``)."""
    twin = module(state)
    if o.shape[0] == 0:
        return o
    twin.gdn_decode_vk(state, q, k, v, g, beta, o, _scale(scale, kd), bool(use_qk_l2norm),
                       A_log=None if gating is None else gating.A_log,
                       dt_bias=None if gating is None else gating.dt_bias,
                       state_indices=state_indices, out_state_indices=out_state_indices)
    return o


def launch_chain(state, q, k, v, g, beta, o, intermediate, gating, state_indices,
                 out_state_indices, scale, use_qk_l2norm, kd: int) -> torch.Tensor:
    """Run the chain twin into ``o [B, K, HV, vd]`` (``gdn_chain`` allocated it; snapshots to
    ``intermediate`` when given and ``K > 1``) and return ``o``. ``g, beta`` as in ``launch``."""
    twin = module(state)
    if o.shape[0] == 0:
        return o
    twin.gdn_chain_vk(state, q, k, v, g, beta, o, _scale(scale, kd), bool(use_qk_l2norm),
                      intermediate=intermediate,
                      A_log=None if gating is None else gating.A_log,
                      dt_bias=None if gating is None else gating.dt_bias,
                      state_indices=state_indices, out_state_indices=out_state_indices)
    return o
