"""The roofline notebook's providers, settings and shared inputs: one input draw per shape, a
``_Case`` per ``(shape, K, B, state_layout, state_dtype)`` (inputs, float64 references) every
provider checks against; ``release()`` drops them. Launchers are called as ``C.<launcher>``."""

from __future__ import annotations

import inspect

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import H200_L2_BYTES
from pmll_lab.carry import (  # noqa: F401  (called as C.<launcher>)
    GDN_CARRY_CAP, GdnCarry, gdn_carry_flush, gdn_carry_verify, gdn_carry_verify_plan,
)
from pmll_lab.experiments.acceptance import acceptance, draw_pending
from pmll_lab.experiments.gdn import QWEN3_NEXT, clone_carry, fill_stash, gating_inputs
from pmll_lab.experiments.replayssm_peer import LABELS as REPLAYSSM_LABELS
from pmll_lab.gdn import gdn_chain, gdn_chain_ref, gdn_decode, gdn_decode_plan  # noqa: F401
from pmll_lab.inputs import gdn_inputs
from pmll_lab.peers import fused_gating
from pmll_lab.reference import carry as ref_carry
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL

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
STATE_DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("kv", "vk")
OURS = ("decodes", "decodes_cuda", "chain_snapshots", "chain_snapshots_cuda", "carry_exact_eager",
        "carry_exact_lazy")
CUDA_TWINS = ("decodes_cuda", "chain_snapshots_cuda")
"""Providers that run a CUDA C++ twin (``impl="cuda"``): a GPU only, V-major, kd <= 256."""
FLASHINFER = ("flashinfer_decode", "flashinfer_mtp_snapshots", "flashinfer_mtp_frozen")
REPLAYSSM = ("flashinfer_replayssm",)
"""FlashInfer's ReplaySSM verify and flush (``replayssm_peer``; rows ``<provider>:verify`` and
``:flush``), on its own bf16 pool and ring whatever the point's state dtype."""
PEERS = ("fla_fused_recurrent",) + FLASHINFER + REPLAYSSM
PROVIDERS = OURS + PEERS
HALF_STATE_PROVIDERS = ("decodes", "decodes_cuda", "chain_snapshots", "chain_snapshots_cuda",
                        "carry_exact_eager",
                        "carry_exact_lazy",
                        *FLASHINFER, *REPLAYSSM)
"""Providers that run a bf16/fp16 state (FLA runs fp32 only)."""
NATIVE_LAYOUT = {"fla_fused_recurrent": "kv", **{p: "vk" for p in CUDA_TWINS},
                 **{p: "vk" for p in FLASHINFER + REPLAYSSM}}
LABELS = {
    "decodes": "K x decode", "decodes_cuda": "K x decode, CUDA twin",
    "chain_snapshots": "chain + snapshots", "chain_snapshots_cuda": "chain + snapshots, CUDA twin",
    "carry_exact_eager": "carry exact, eager", "carry_exact_lazy": "carry exact, lazy (amortised)",
    "fla_fused_recurrent": "FLA fused_recurrent", "flashinfer_decode": "FlashInfer decode",
    "flashinfer_mtp_snapshots": "FlashInfer mtp + snapshots",
    "flashinfer_mtp_frozen": "FlashInfer mtp, frozen (no buffer)",
    **REPLAYSSM_LABELS,
}
MAIN_SHAPE = dict(QWEN3_NEXT)
SHAPE_KEYS = ("HK", "HV", "head_dim", "dtype")
_LAUNCHERS = {"decodes": ("gdn_decode", "gdn_decode_plan"), "chain_snapshots": ("gdn_chain",),
              "carry": ("gdn_carry_verify", "gdn_carry_verify_plan", "gdn_carry_flush")}


def layout_support(provider: str, layout: str) -> bool:
    """Whether ``provider`` runs with states in ``layout``: a peer in its own layout only; ours
    in ``"kv"`` always and in ``"vk"`` where every launcher it calls takes ``state_layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    if provider in NATIVE_LAYOUT:
        return NATIVE_LAYOUT[provider] == layout
    names = _LAUNCHERS["carry" if provider.startswith("carry_") else provider] + ("gdn_decode",)
    return layout == "kv" or all(
        "state_layout" in inspect.signature(globals()[n]).parameters for n in names)


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
        x = gdn_inputs(seed, S, HK, HV, D, D, rows=Kmax, dtype=getattr(torch, point["dtype"]))
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


class _Case:
    """One ``(shape, K, B, state_layout, state_dtype)``: input views, float64 references on
    ``N_REF`` sequences (K-major; ``to_layout`` for V-major comparisons), and on first use the
    decode baseline and the carry references per pending-count variant."""

    def __init__(self, point: dict, shape: dict):
        self.K, self.B, self.HK, self.HV, self.D = (
            int(point[n]) for n in ("K", "B", "HK", "HV", "head_dim"))
        self.dname = point["dtype"]
        self.dtype = getattr(torch, self.dname)
        self.seed = int(point["seed"])
        self.layout = point.get("state_layout", "kv")
        self.sdname = point.get("state_dtype", "float32")
        self.sdt = getattr(torch, self.sdname)
        half = self.sdname != "float32"
        self.ref_sdt = self.sdt if half else None      # the reference's rounding points
        self.stol = HALF_STATE_TOL[self.sdname] if half else STATE_TOL
        self.lay = {} if self.layout == "kv" else {"state_layout": self.layout}
        self.acc = acceptance(self.K, float(point["mean_accept"]), int(point["accept_K"]),
                              seed=self.seed)
        x, K, B = shape["x"], self.K, self.B
        self.shape = shape
        self.state_kv = _state_in(shape, "kv", self.sdt)
        self.state0 = _state_in(shape, self.layout, self.sdt)
        self.sel = x["state_indices"][:B].contiguous()
        self.lsel = self.sel.long()
        self.args = tuple(x[n][:B, :K] for n in ("q", "k", "v", "g", "beta"))
        self.gate = tuple(shape["gate"][n] for n in ("A_log", "a", "dt_bias", "b"))
        self.row_args = [tuple(t[:, r] for t in self.args) for r in range(K)]
        self.stash = shape["stash"]
        self.n = min(B, N_REF)
        self.otol = max(O_TOL[self.dname], self.stol if half else 0.0)
        sub = self.state_kv[self.lsel[:self.n]].to("cpu", torch.float64)
        self.cpu_args = tuple(t[:self.n].cpu() for t in self.args)
        self.o_ref, self.s_ref, self.i_ref = gdn_chain_ref(sub, *self.cpu_args,
                                                           state_dtype=self.ref_sdt)
        self._dec: dict = {}
        self._carry: dict = {}
        self._fi_ref = None

    def to_layout(self, t: torch.Tensor) -> torch.Tensor:
        """A K-major state tensor ``[..., kd, vd]`` seen in this case's layout (a view)."""
        return t if self.layout == "kv" else t.transpose(-1, -2)

    def io(self) -> dict:
        return dict(num_k_heads=self.HK, num_v_heads=self.HV, k_dim=self.D, v_dim=self.D,
                    dtype=self.dtype, state_dtype=self.sdt)

    def decoded(self, layout: str | None = None):
        """``K`` validated ``gdn_decode`` launches from the state in ``layout`` (default this
        case's): ``(o [B, K, HV, vd], final states [B, ...], list of K-1 snapshots)``."""
        layout = self.layout if layout is None else layout
        if layout not in self._dec:
            lay = {} if layout == "kv" else {"state_layout": layout}
            st = _state_in(self.shape, layout, self.sdt).clone()
            outs, snaps = [], []
            for r in range(self.K):
                outs.append(gdn_decode(st, *self.row_args[r], state_indices=self.sel,
                                       validate=True, **lay))
                if r < self.K - 1:
                    snaps.append(st[self.lsel])
            self._dec[layout] = (torch.stack(outs, 1), st[self.lsel], snaps)
        return self._dec[layout]

    def fi_ref(self):
        """The float64 chain with FlashInfer's own gating (``g, beta`` recomputed in float64
        from the raw inputs): ``(o, state, snapshots)`` of ``n`` sequences, K-major."""
        if self._fi_ref is None:
            A_log, a, dt_bias, b = (t.cpu() for t in self.gate)
            g, beta = fused_gating(A_log, a[:self.n, :self.K], dt_bias, b[:self.n, :self.K],
                                   dtype=torch.float64)
            sub = self.state_kv[self.lsel[:self.n]].to("cpu", torch.float64)
            self._fi_ref = gdn_chain_ref(sub, *self.cpu_args[:3], g, beta,
                                         state_dtype=self.ref_sdt)
        return self._fi_ref

    def carry_case(self, variant: str) -> dict:
        """Pending counts for ``variant`` (``eager``, ``nowb``, ``wb``) drawn from the acceptance
        process, the carry holding them, plain decoding after folding (``o_dec``, ``folded``),
        and the float64 protocol reference on ``n`` sequences (``o_ref``, ``state_ref``,
        ``u_ref``)."""
        if variant in self._carry:
            return self._carry[variant]
        lazy = variant != "eager"
        rng = np.random.default_rng([self.seed, self.K, self.B,
                                     ("eager", "nowb", "wb").index(variant)])
        hist = self.acc["lazy_hist" if lazy else "eager_hist"]
        pend = draw_pending(hist, self.B, self.K, rng,
                            write_back=None if not lazy else variant == "wb", lazy=lazy)
        wb = (pend + self.K > CAP) if lazy else (pend > 0)
        carry = clone_carry(self.stash)
        carry.pend[self.lsel] = torch.as_tensor(pend, dtype=torch.int32).to(DEVICE)
        st = self.state0.clone()
        gdn_carry_flush([st], [carry], self.sel, validate=True, **self.lay)
        folded = st[self.lsel]
        outs = [gdn_decode(st, *self.row_args[r], state_indices=self.sel, **self.lay)
                for r in range(self.K)]
        s = self.lsel[:self.n]
        sub_state = self.state_kv[s].to("cpu", torch.float64)
        sub = ref_carry.RefCarry(u=carry.u[s].to("cpu", torch.float64),
                                 g=carry.g[s].to("cpu", torch.float64),
                                 k=carry.k[s].to("cpu", torch.float64),
                                 pend=carry.pend[s].to("cpu", torch.int64))
        o_ref, _ = ref_carry.verify(sub_state, sub, *self.cpu_args, torch.arange(self.n),
                                    lazy=lazy, state_dtype=self.ref_sdt)
        self._carry[variant] = dict(pend=pend, wb=wb, lazy=lazy, carry=carry,
                                    o_dec=torch.stack(outs, 1), folded=folded, o_ref=o_ref,
                                    state_ref=sub_state, u_ref=sub.u)
        return self._carry[variant]


def case(point: dict) -> _Case:
    """The ``_Case`` of ``point`` (one kept at a time)."""
    shape = _shape(point)
    key = tuple(point.get(n, "kv") for n in ("seed", "slots", "rows_max", "HK", "HV", "head_dim",
                                              "dtype", "K", "B", "mean_accept", "accept_K",
                                              "state_layout")) + (point.get("state_dtype"),)
    if key not in _CASE:
        _CASE.clear()
        _CASE[key] = _Case(point, shape)
    return _CASE[key]
