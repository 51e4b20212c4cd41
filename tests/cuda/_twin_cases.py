"""Shared by the GDN twins' tests (test_cuda_twins_chain.py, test_cuda_twins_carry.py): seeded
inputs of a V-major chain or verify.

``vk_case(...) -> (x, state, slots, gates, (g, beta))``: ``x`` from ``gdn_inputs``, ``state``
its pool as a contiguous V-major ``[S, HV, vd, kd]`` one in ``state_dtype``, ``slots`` its
slot table (``pad``: lane 1 a padding lane, slot -1), ``gates`` the launcher's gate arguments
(``g, beta``, or with ``gated`` the raw ``A_log, a, dt_bias, b``) and ``(g, beta)`` what the
reference takes.
"""

from __future__ import annotations

import torch

from pmll_lab.backend import DEVICE
from pmll_lab.gdn import gdn_gating_ref
from pmll_lab.inputs import gdn_inputs


def vk(state):
    """A K-major ``[S, HV, kd, vd]`` state as a contiguous V-major ``[S, HV, vd, kd]`` one."""
    return state.transpose(-1, -2).contiguous()


def vk_case(seed, dtype, state_dtype, B, K, S, HK, HV, kd, vd, pad, gated):
    x = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, slots=S, dtype=dtype, state_layout="kv")
    state = vk(x["state"]).to(state_dtype)
    slots = x["state_indices"].clone()
    if pad:
        slots[1] = -1
    if gated:
        gen = torch.Generator().manual_seed(seed)
        gates = dict(A_log=(torch.rand(HV, generator=gen) * 2 - 1).to(DEVICE),
                     dt_bias=torch.randn(HV, generator=gen).to(DEVICE),
                     a=(torch.randn(B, K, HV, generator=gen) * 3).to(dtype).to(DEVICE),
                     b=(torch.randn(B, K, HV, generator=gen) * 3).to(dtype).to(DEVICE))
        gb = gdn_gating_ref(gates["A_log"], gates["a"], gates["dt_bias"], gates["b"])
    else:
        gates = dict(g=x["g"], beta=x["beta"])
        gb = (x["g"], x["beta"])
    return x, state, slots, gates, gb
