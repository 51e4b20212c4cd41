"""``gdn_decode(impl="cuda")``: the decode's CUDA C++ twin (``kernels/gdn_decode.cu``) on a
V-major state, launched after ``gdn_decode``'s own checks (SPEC §2).

The twin computes the same token (in-kernel gating and l2norm, padding lanes of slot -1,
``out_state_indices``, fp32/bf16/fp16 state rounded once when stored) with one warp per value
row; its sums over keys run in another order than the Triton kernel's, so it answers to the
float64 reference within the decode's tolerance, not bitwise to Triton. V-major states
(``state_layout="vk"``) and ``kd <= 256`` only: anything else is a ``ValueError`` naming
``impl``. Without a CUDA device: ``RuntimeError`` from ``pmll_lab.cuda_ext``, before compiling.
"""

from __future__ import annotations

import torch

from pmll_lab import cuda_ext

MAX_KD = 256
"""Keys per state row the twin holds (8 per lane of a warp; ``kGdnMaxKd`` in the header)."""


def check_cuda(state, kd: int, layout: str) -> None:
    """What the twin takes beyond ``gdn_decode``'s checks: ``ValueError`` naming ``impl``."""
    if layout != "vk":
        raise ValueError(f"impl: the CUDA twin of the decode takes V-major states only "
                         f"(state_layout='vk'), got state_layout={layout!r}")
    if kd > MAX_KD:
        raise ValueError(f"impl: the CUDA twin of the decode takes kd <= {MAX_KD}, got kd={kd}")


def launch(state, q, k, v, g, beta, o, gating, state_indices, out_state_indices, scale,
           use_qk_l2norm, kd: int) -> torch.Tensor:
    """Run the twin into ``o`` (``gdn_decode`` allocated it) and return ``o``. ``g, beta`` are
    ``a, b`` when ``gating`` is given (``split_gating``)."""
    cuda_ext.require_gpu()
    if state.device.type != "cuda":
        raise ValueError(f"impl: 'cuda' runs on CUDA tensors, but the state is on {state.device}; "
                         "use impl='triton'")
    twin = cuda_ext.load("gdn_decode")
    if o.shape[0] == 0:
        return o
    twin.gdn_decode_vk(state, q, k, v, g, beta, o, float(kd ** -0.5 if scale is None else scale),
                       bool(use_qk_l2norm),
                       A_log=None if gating is None else gating.A_log,
                       dt_bias=None if gating is None else gating.dt_bias,
                       state_indices=state_indices, out_state_indices=out_state_indices)
    return o
