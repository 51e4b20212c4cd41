"""The roofline's shared inputs and references: one input draw per shape, and per ``(shape, K,
B, state_layout, state_dtype)`` a ``_Case`` holding the input views, the float64 references on
``N_REF`` sequences and (on first use) the decode baseline and the carry references per
pending-count variant; every provider of that case (``roofline_ours``, ``roofline_peers``) checks
against them. ``roofline.release()`` drops them (module docstring of ``roofline``, "Inputs").

Our launchers are called as attributes of ``roofline`` (``E.gdn_decode``), so that a test that
replaces one there replaces it in the baselines too.
"""

from __future__ import annotations

import numpy as np
import torch

from pmll_lab.backend import DEVICE
from pmll_lab.carry import GdnCarry
from pmll_lab.gdn import gdn_chain_ref
from pmll_lab.inputs import gdn_inputs
from pmll_lab.peers import fused_gating
from pmll_lab.reference import carry as ref_carry
from pmll_lab.experiments import roofline as E
from pmll_lab.experiments.acceptance import acceptance, draw_pending
from pmll_lab.experiments.common import clone_carry, fill_stash, gating_inputs
from pmll_lab.experiments.roofline import (
    CAP, HALF_STATE_TOL, N_REF, O_TOL, STATE_TOL, _CASE, _SHAPE,
)


def _shape(point: dict) -> dict:
    """Inputs of one shape (all ``(K, B, layout)`` of it take views): ``gdn_inputs`` with its
    ``g, beta`` replaced by those of ``gating_inputs`` (whose raw inputs FlashInfer takes), the
    stash, and (on first use) the V-major copy of the state."""
    key = (point["seed"], point["slots"], point["rows_max"], point["HK"], point["HV"],
           point["head_dim"], point["dtype"])
    if key not in _SHAPE:
        _SHAPE.clear()      # one shape at a time: the previous shape's tensors are dropped
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
    """The shape's state pool in ``layout`` and ``state_dtype`` (each copy made once; never
    written). A bf16 pool holds the fp32 draw rounded to nearest."""
    key = f"state_{layout}_{state_dtype}"
    if key not in shape:
        st = shape["x"]["state"]
        st = st if layout == "kv" else st.transpose(-1, -2).contiguous()
        shape[key] = st if state_dtype == torch.float32 else st.to(state_dtype)
    return shape[key]


class _Case:
    """One ``(shape, K, B, state_layout)``: input views, float64 references on ``N_REF``
    sequences (K-major; ``to_layout`` transposes them for V-major comparisons), and (on first
    use) the decode baseline and the carry references per pending-count variant."""

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
        # the reference's rounding points (None: float64 throughout, the fp32 state's reference)
        self.ref_sdt = self.sdt if half else None
        self.stol = HALF_STATE_TOL[self.sdname] if half else STATE_TOL
        # the keyword goes to our launchers only for "vk", so that launchers without it run "kv"
        self.lay = {} if self.layout == "kv" else {"state_layout": self.layout}
        self.acc = acceptance(self.K, float(point["mean_accept"]), int(point["accept_K"]),
                              seed=self.seed)
        x = shape["x"]
        K, B = self.K, self.B
        self.shape = shape
        self.state_kv = _state_in(shape, "kv", self.sdt)       # [S, HV, kd, vd], never written
        self.state0 = _state_in(shape, self.layout, self.sdt)  # the same in this case's layout
        self.sel = x["state_indices"][:B].contiguous()         # B distinct slots of S
        self.lsel = self.sel.long()
        self.args = tuple(x[n][:B, :K] for n in ("q", "k", "v", "g", "beta"))
        self.gate = tuple(shape["gate"][n] for n in ("A_log", "a", "dt_bias", "b"))
        self.row_args = [tuple(t[:, r] for t in self.args) for r in range(K)]
        self.stash = shape["stash"]
        self.n = min(B, N_REF)
        self.otol = max(O_TOL[self.dname], self.stol if half else 0.0)
        sub = self.state_kv[self.lsel[:self.n]].to("cpu", torch.float64)
        self.cpu_args = tuple(t[:self.n].cpu() for t in self.args)
        self.o_ref, s_ref, self.i_ref = gdn_chain_ref(sub, *self.cpu_args,
                                                      state_dtype=self.ref_sdt)
        self.s_ref = s_ref
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
        """``K`` ``gdn_decode`` launches (validated) from the state in ``layout`` (default this
        case's): ``(o [B, K, HV, vd], final states [B, ...], snapshots: list of K-1 states
        [B, ...])``, states in that layout."""
        layout = self.layout if layout is None else layout
        if layout not in self._dec:
            lay = {} if layout == "kv" else {"state_layout": layout}
            st = _state_in(self.shape, layout, self.sdt).clone()
            outs, snaps = [], []
            for r in range(self.K):
                outs.append(E.gdn_decode(st, *self.row_args[r], state_indices=self.sel,
                                         validate=True, **lay))
                if r < self.K - 1:
                    snaps.append(st[self.lsel])
            self._dec[layout] = (torch.stack(outs, 1), st[self.lsel], snaps)
            del st
        return self._dec[layout]

    def fi_ref(self):
        """The float64 chain reference with FlashInfer's own gating: ``g, beta`` recomputed in
        float64 from the raw ``A_log, a, dt_bias, b`` (``pmll_lab.peers.fused_gating``).
        ``(o [n, K, HV, vd], state [n, HV, kd, vd], snapshots [n, K-1, HV, kd, vd])``."""
        if self._fi_ref is None:
            A_log, a, dt_bias, b = (t.cpu() for t in self.gate)
            # the gating rows follow the batch rows (as q, k, v do), not the slots
            g, beta = fused_gating(A_log, a[:self.n, :self.K], dt_bias, b[:self.n, :self.K],
                                   dtype=torch.float64)
            sub = self.state_kv[self.lsel[:self.n]].to("cpu", torch.float64)
            self._fi_ref = gdn_chain_ref(sub, *self.cpu_args[:3], g, beta,
                                         state_dtype=self.ref_sdt)
        return self._fi_ref

    def carry_case(self, variant: str) -> dict:
        """Pending counts for ``variant`` (``eager``, ``nowb``, ``wb``) drawn from the
        acceptance process, the carry holding them, and its references: plain decoding after
        folding (``o_dec``, ``folded`` states of the B slots, this case's layout) and the
        float64 protocol reference on ``N_REF`` sequences (``o``, state after the verify
        (K-major), stash ``u``)."""
        if variant in self._carry:
            return self._carry[variant]
        lazy = variant != "eager"
        rng = np.random.default_rng([self.seed, self.K, self.B, ("eager", "nowb", "wb").index(variant)])
        hist = self.acc["lazy_hist" if lazy else "eager_hist"]
        pend = draw_pending(hist, self.B, self.K, rng,
                            write_back=None if not lazy else variant == "wb", lazy=lazy)
        wb = (pend + self.K > CAP) if lazy else (pend > 0)
        carry = clone_carry(self.stash)
        carry.pend[self.lsel] = torch.as_tensor(pend, dtype=torch.int32).to(DEVICE)
        st = self.state0.clone()
        E.gdn_carry_flush([st], [carry], self.sel, validate=True, **self.lay)
        folded = st[self.lsel]
        outs = [E.gdn_decode(st, *self.row_args[r], state_indices=self.sel, **self.lay)
                for r in range(self.K)]
        del st
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


def _case(point: dict) -> _Case:
    shape = _shape(point)
    key = tuple(point.get(n, "kv") for n in ("seed", "slots", "rows_max", "HK", "HV", "head_dim",
                                              "dtype", "K", "B", "mean_accept", "accept_K",
                                              "state_layout")) + (point.get("state_dtype"),)
    if key not in _CASE:
        _CASE.clear()
        _CASE[key] = _Case(point, shape)
    return _CASE[key]
