"""``gdn_carry_verify(impl="cuda")`` and ``gdn_carry_flush(impl="cuda")``: the CUDA C++ twins of
the carried-state verify (exact form, eager and lazy) and of its flush on a V-major state
(``kernels/gdn_carry.cu``), launched after the Triton launchers' own checks (SPEC §3b).

Same inputs, stash (``GdnCarry``), pending counts, outputs and ``engaged`` / write-back rules as
the Triton launchers; the twins run the decode twin's grid, lane groups and per-token code
(``kernels/gdn_row.cuh``), fold each pending row with the same two roundings as the decode's
state update and round the state to its dtype after every folded and verified row. So, within
the CUDA path, the protocol (verify, ``carry_accept``, flush) gives outputs and states bitwise
equal to ``gdn_decode(impl="cuda")`` launches of the accepted rows (not bitwise the Triton carry:
the sums over keys run in another order; both answer to the float64 reference). V-major states
and ``kd <= 256`` only (``ValueError`` naming ``impl``); ``RuntimeError`` without a CUDA device,
before compiling. The verify's shared ``g``/``k`` stash rows use the Triton split form's
arrival counts (``GdnCarry._arrivals``), left at zero by both.
"""

from __future__ import annotations

import torch

from pmll_lab.ops.carry.common import offsets_table
from pmll_lab.ops.gdn import decode_cuda


def check_cuda(state, kd: int, layout: str, what: str) -> None:
    """What the twin of ``what`` takes beyond its launcher's checks (a V-major state,
    ``kd <= 256``): ``ValueError`` naming ``impl``."""
    decode_cuda.check_cuda(state, kd, layout, what)


def launch_verify(state, carry, arrive, q, k, v, g, beta, o, engaged, slot_tab, lazy: bool,
                  scale: float, use_qk_l2norm, gating) -> None:
    """Run the verify twin into ``o [B, K, HV, vd]`` and ``engaged [B]`` (allocated by
    ``gdn_carry_verify``). ``g, beta`` are ``a, b`` when ``gating`` is given; ``arrive``: the
    ``[S, HV]`` int32 arrival counts (zeros)."""
    twin = decode_cuda.module(state)
    if o.shape[0] == 0:
        return
    twin.gdn_carry_verify_vk(state, carry.buf, carry.pend, slot_tab, arrive, q, k, v, g, beta,
                             o, engaged, float(scale), bool(use_qk_l2norm), int(carry.cap),
                             bool(lazy),
                             A_log=None if gating is None else gating.A_log,
                             dt_bias=None if gating is None else gating.dt_bias)


def launch_flush(states: list[torch.Tensor], carries: list, slot_tab) -> None:
    """Run the flush twin over ``L`` layers in one launch (layer ``l`` at the element offsets of
    ``offsets_table``, as the Triton flush addresses them)."""
    twin = decode_cuda.module(states[0])
    if slot_tab.shape[0] == 0:
        return
    pends = [c.pend for c in carries]
    twin.gdn_carry_flush_vk(states[0], carries[0].buf, pends[0], slot_tab,
                            offsets_table(states), offsets_table([c.buf for c in carries]),
                            offsets_table(pends), int(carries[0].cap))
