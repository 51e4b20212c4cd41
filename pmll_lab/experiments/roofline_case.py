"""The roofline notebook's providers, settings and shared inputs: one input draw per shape, a
``RooflineCase`` per ``(shape, K, B, state_layout, state_dtype)`` (inputs, float64 references) every
provider checks against; ``release()`` drops them."""

from __future__ import annotations

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import H200_L2_BYTES
from pmll_lab.carry import GDN_CARRY_CAP, GdnCarry
from pmll_lab.experiments.acceptance import acceptance, draw_pending
from pmll_lab.experiments.gdn import QWEN3_NEXT, fill_stash, gating_inputs
from pmll_lab.experiments.gdn_case import Case
from pmll_lab.experiments.replayssm_peer import KERNELS as REPLAYSSM_KERNELS
from pmll_lab.experiments.replayssm_peer import LABELS as REPLAYSSM_LABELS
from pmll_lab.experiments.replayssm_peer import PROVIDER as REPLAYSSM_PROVIDER
from pmll_lab.gdn import gdn_chain_ref
from pmll_lab.harness import registry, verify
from pmll_lab.inputs import gdn_inputs

CAP = GDN_CARRY_CAP
N_REF = 2
"""Sequences checked against the float64 references (the decode comparisons cover all ``B``)."""
TIMING = dict(warmup_ms=10, rep_ms=50, cpu_reps=1, replays=200)
"""``do_bench`` windows (ms; the full preset times ~350 launches), interpreter calls, graph
replays per timed launch."""
GRAPH_REPLAYS = TIMING["replays"]
PLAN_MAX_B = 1
"""Batch widths up to which decodes and carry verifies also run through launch plans
(``<kernel>:plan``: arguments bound once, the host-bound small-batch path)."""
L2_BYTES = H200_L2_BYTES
STATE_DTYPES = registry.STATE_DTYPES
LAYOUTS = ("kv", "vk")
PROVIDERS = tuple(registry.names(verify.FAMILY))
"""Every implementation of the ``roofline_verify`` family (``harness.verify``), in its order: ours,
then the peers."""
OURS = tuple(registry.names(verify.FAMILY, provider="pmll_lab"))
PEERS = tuple(p for p in PROVIDERS if p not in OURS)
CUDA_TWINS = tuple(p for p in PROVIDERS if registry.get(p).impl == "cuda")
"""Providers that run a CUDA C++ twin (``impl="cuda"``): a GPU only, V-major, kd <= 256."""
REPLAYSSM = (REPLAYSSM_PROVIDER,)
"""FlashInfer's ReplaySSM verify and flush (``replayssm_peer``; rows ``<provider>:verify`` and
``:flush``), on its own bf16 pool and ring whatever the point's state dtype."""
FLASHINFER = tuple(p for p in PEERS if registry.get(p).provider == "flashinfer"
                   and p not in REPLAYSSM)
"""FlashInfer's providers that ``roofline_providers.point_flashinfer`` runs."""
HALF_STATE_PROVIDERS = tuple(p for p in PROVIDERS
                             if set(registry.get(p).state_dtypes) - {"float32"})
"""Providers that run a bf16/fp16 state (their registrations' ``state_dtypes``; FLA: fp32)."""
NATIVE_LAYOUT = {p: registry.get(p).layouts[0] for p in PROVIDERS
                 if len(registry.get(p).layouts) == 1}
"""The one layout of a provider that runs only one (its registration's ``layouts``)."""
LABELS = {**{p: registry.label(p) for p in PROVIDERS},
          **{k: REPLAYSSM_LABELS[k] for k in REPLAYSSM_KERNELS}}
"""Each provider's registered label, and the ReplaySSM variants' (``replayssm_peer``)."""
MAIN_SHAPE = dict(QWEN3_NEXT)
SHAPE_KEYS = ("HK", "HV", "head_dim", "dtype")


def layout_support(provider: str, layout: str) -> bool:
    """Whether ``provider`` runs with states in ``layout`` (its registration's ``layouts``: a
    peer and a CUDA twin in their own layout only, ours in both)."""
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    return layout in registry.get(provider).layouts


_SHAPE: dict = {}
_CASE: dict = {}


def release() -> None:
    """Drop the cached inputs, decode baselines and carry references (frees device memory)."""
    _SHAPE.clear()
    _CASE.clear()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


def _shape(point: dict) -> dict:
    """Inputs of one shape (its ``(K, B, layout)`` take views): ``gdn_inputs`` gated by
    ``gating_inputs`` (whose raw inputs FlashInfer takes) and the stash."""
    key = tuple(point[n] for n in ("seed", "slots", "rows_max", "HK", "HV", "head_dim", "dtype"))
    if key not in _SHAPE:
        _SHAPE.clear()      # one shape at a time
        _CASE.clear()
        S, Kmax, HK, HV, D = (int(point[n]) for n in ("slots", "rows_max", "HK", "HV", "head_dim"))
        seed = int(point["seed"])
        x = gdn_inputs(seed, S, HK, HV, D, D, rows=Kmax, dtype=getattr(torch, point["dtype"]),
                       state_layout="kv")
        gate = gating_inputs(seed + 11, (S, Kmax), HV)
        x["g"], x["beta"] = gate["g"], gate["beta"]
        stash = GdnCarry.empty(S, HV, D, D, cap=CAP)
        fill_stash(stash, seed + 7)
        _SHAPE[key] = dict(x=x, gate=gate, stash=stash)
    return _SHAPE[key]


def _state_in(shape: dict, layout: str, state_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The shape's state pool in ``layout`` and ``state_dtype`` (made once; never written)."""
    key = f"state_{layout}_{state_dtype}"
    if key not in shape:
        st = shape["x"]["state"]
        st = st if layout == "kv" else st.transpose(-1, -2).contiguous()
        shape[key] = st if state_dtype == torch.float32 else st.to(state_dtype)
    return shape[key]


class RooflineCase(Case):
    """One ``(shape, K, B, state_layout, state_dtype)`` (``gdn_case.Case``): views of the
    shape's inputs, float64 references on ``N_REF`` sequences, the acceptance process, and the
    carry references per pending-count variant (``variant``)."""

    def __init__(self, point: dict, shape: dict):
        sdt = getattr(torch, point.get("state_dtype", "float32"))
        super().__init__(point, shape["x"], shape["gate"], _state_in(shape, "kv", sdt),
                         _state_in(shape, point.get("state_layout", "kv"), sdt),
                         n=min(int(point["B"]), N_REF), stash=shape["stash"])
        self.seed = int(point["seed"])
        self.acc = acceptance(self.K, float(point["mean_accept"]), int(point["accept_K"]),
                              seed=self.seed)
        sub = self.state_kv[self.lsel[:self.n]].to("cpu", torch.float64)
        self.o_ref, self.s_ref, self.i_ref = gdn_chain_ref(sub, *self.cpu_args,
                                                           state_dtype=self.ref_sdt,
                                                           state_layout="kv")

    def variant(self, variant: str) -> dict:
        """``carry_case`` of pending counts for ``variant`` (``eager``, ``nowb``, ``wb``) drawn
        from the acceptance process (``nowb`` / ``wb``: the lazy verify without / with a
        write-back)."""
        lazy = variant != "eager"
        rng = np.random.default_rng([self.seed, self.K, self.B,
                                     ("eager", "nowb", "wb").index(variant)])
        pend = draw_pending(self.acc["lazy_hist" if lazy else "eager_hist"], self.B, self.K, rng,
                            write_back=None if not lazy else variant == "wb", lazy=lazy)
        return self.carry_case(variant, pend, lazy)


def case(point: dict) -> RooflineCase:
    """The ``RooflineCase`` of ``point`` (one kept at a time)."""
    shape = _shape(point)
    key = tuple(point.get(n, "kv") for n in ("seed", "slots", "rows_max", "HK", "HV", "head_dim",
                                              "dtype", "K", "B", "mean_accept", "accept_K",
                                              "state_layout")) + (point.get("state_dtype"),)
    if key not in _CASE:
        _CASE.clear()
        _CASE[key] = RooflineCase(point, shape)
    return _CASE[key]
