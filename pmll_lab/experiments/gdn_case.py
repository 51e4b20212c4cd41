"""One GDN verify of ``K`` draft rows of ``B`` sequences, and the checks the gdn_verify,
carry_protocol and roofline points run on it (SPEC §2, §3a, §3b): the chain with snapshots, the
decodes and the exact carried-state verify against float64 references on the first ``n``
sequences and against plain decoding, bitwise, on all; at small batches the launch plans
bitwise against the launchers. Each notebook draws its own inputs and references; a ``Case``
holds them. The launchers are called by their names here (a test replaces them here).
"""

from __future__ import annotations

import numpy as np
import torch

from pmll_lab import peers
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, error_rows
from pmll_lab.carry import (
    GDN_CARRY_CAP, GdnCarry, gdn_carry_flush, gdn_carry_verify, gdn_carry_verify_plan,
)
from pmll_lab.experiments import protocol as P
from pmll_lab.gdn import gdn_chain, gdn_chain_ref, gdn_decode, gdn_decode_plan
from pmll_lab.harness.decode import FLASHINFER_DECODE
from pmll_lab.reference import carry as ref_carry
from pmll_lab.tolerances import HALF_STATE_TOL, O_TOL, STATE_TOL

CAP = GDN_CARRY_CAP
ROWS = ("q", "k", "v", "g", "beta")


def clone_carry(c: GdnCarry, state_layout: str | None = None) -> GdnCarry:
    """A copy of ``c`` (stash rows and pending counts) a launch may write, for a pool in
    ``state_layout`` (default ``c``'s: the stash rows are the same in both layouts)."""
    return GdnCarry(c.buf.clone(), c.pend.clone(), c.num_v_heads, c.k_dim, c.v_dim, c.cap,
                    c.state_layout if state_layout is None else state_layout)


class Case:
    """``point``'s ``K, B, HK, HV, head_dim, dtype``, optional ``state_layout`` ("kv") and
    ``state_dtype`` ("float32"); ``x``: ``gdn_inputs``-style rows (``[:B, :K]`` are used) and
    ``state_indices``, gated by ``gate`` (``gating_inputs``: FlashInfer's raw inputs);
    ``state_kv``: the K-major pool, ``state0``: the pool in the layout (never written); ``n``:
    sequences held to the references ``o_ref``, ``s_ref``, ``i_ref`` (K-major, set by the
    caller; ``to_layout`` views them in the layout)."""

    def __init__(self, point: dict, x: dict, gate: dict, state_kv, state0, *, n: int,
                 stash=None):
        self.K, self.B, self.HK, self.HV, self.D = (
            int(point[k]) for k in ("K", "B", "HK", "HV", "head_dim"))
        self.dname = point.get("dtype", "bfloat16")
        self.sdname = point.get("state_dtype", "float32")
        self.dtype, self.sdt = getattr(torch, self.dname), getattr(torch, self.sdname)
        half = self.sdname != "float32"
        self.ref_sdt = self.sdt if half else None      # the reference's rounding points
        self.stol = HALF_STATE_TOL[self.sdname] if half else STATE_TOL
        self.otol = max(O_TOL[self.dname], self.stol if half else 0.0)
        self.layout = point.get("state_layout", "kv")
        self.lay = {"state_layout": self.layout}
        self.state_kv, self.state0, self.n, self.stash = state_kv, state0, n, stash
        self.sel = x["state_indices"][:self.B].contiguous()
        self.lsel = self.sel.long()
        self.args = tuple(x[k][:self.B, :self.K] for k in ROWS)
        self.row_args = [tuple(t[:, r] for t in self.args) for r in range(self.K)]
        self.cpu_args = tuple(t[:n].cpu() for t in self.args)
        self.gate = tuple(gate[k] for k in ("A_log", "a", "dt_bias", "b"))
        self._dec, self._carry, self._fi = {}, {}, {}

    def to_layout(self, t: torch.Tensor) -> torch.Tensor:
        """A K-major state tensor ``[..., kd, vd]`` seen in this case's layout (a view)."""
        return t if self.layout == "kv" else t.transpose(-1, -2)

    def io(self) -> dict:
        return dict(num_k_heads=self.HK, num_v_heads=self.HV, k_dim=self.D, v_dim=self.D,
                    dtype=self.dtype, state_dtype=self.sdt)

    def ref_rows(self, name: str, o, st) -> list[dict]:
        """``o [>= n, K, HV, vd]`` and the final states ``st [>= n, ...]`` (layout) against
        the float64 references on the first ``n`` sequences."""
        return (error_rows(name, o[:self.n], self.o_ref, tol=self.otol, what="o")
                + error_rows(name, st[:self.n], self.to_layout(self.s_ref), tol=self.stol,
                             what="state"))

    def decoded(self, layout: str | None = None):
        """``K`` validated ``gdn_decode`` launches from the pool in ``layout`` (default this
        case's): ``(o [B, K, HV, vd], final states [B, ...], list of K-1 snapshots, pool)``."""
        layout = self.layout if layout is None else layout
        if layout not in self._dec:
            st = (self.state0 if layout == self.layout else self.state_kv).clone()
            outs, snaps = [], []
            for r in range(self.K):
                outs.append(gdn_decode(st, *self.row_args[r], state_indices=self.sel,
                                       validate=True, state_layout=layout))
                if r < self.K - 1:
                    snaps.append(st[self.lsel])
            self._dec[layout] = (torch.stack(outs, 1), st[self.lsel], snaps, st)
        return self._dec[layout]

    def decodes_run(self, st, **kw):
        """``K`` ``gdn_decode`` launches on the pool ``st`` (``kw``: ``impl``): a call to time."""
        def run():
            for r in self.row_args:
                gdn_decode(st, *r, state_indices=self.sel, **self.lay, **kw)
        return run

    def chain_run(self, st, inter=None, **kw):
        """``gdn_chain`` on the pool ``st`` (snapshots to ``inter``): a call to time."""
        return lambda: gdn_chain(st, *self.args, state_indices=self.sel, intermediate=inter,
                                 **self.lay, **kw)

    def carry_run(self, st, carry, form: str, lazy: bool):
        """``gdn_carry_verify`` on ``st`` and ``carry`` (``pend`` left alone: every call does
        the same work): a call to time."""
        return lambda: gdn_carry_verify(st, carry, *self.args, slot_tab=self.sel, form=form,
                                        lazy=lazy, **self.lay)

    def chain(self, **kw):
        """The chain with its ``K-1`` snapshots (``kw`` to ``gdn_chain``) from a copy of the
        pool: ``(o, state pool, snapshots)``."""
        st = self.state0.clone()
        inter = torch.empty(self.B, self.K - 1, self.HV, self.D, self.D, dtype=self.sdt,
                            device=DEVICE)
        o = gdn_chain(st, *self.args, state_indices=self.sel, intermediate=inter, **self.lay,
                      **kw)
        return o, st, inter

    def check_chain(self, name: str, **kw):
        """``chain(**kw)`` against the float64 references: ``(rows, o, state pool,
        snapshots)``."""
        o, st, inter = self.chain(**kw)
        rows = self.ref_rows(name, o, st[self.lsel[:self.n]])
        if self.K > 1:
            rows += error_rows(name, inter[:self.n], self.to_layout(self.i_ref), tol=self.stol,
                               what="snapshots")
        return rows, o, st, inter

    def carry_case(self, key, pend: np.ndarray, lazy: bool) -> dict:
        """The stash holding ``pend`` rows per sequence (cached under ``key``), plain decoding
        after folding them (``o_dec``; ``folded``: the states at the slots) and the float64
        protocol on ``n`` sequences (``o_ref``, ``state_ref`` K-major, ``u_ref``)."""
        if key not in self._carry:
            wb = (pend + self.K > CAP) if lazy else (pend > 0)
            carry = clone_carry(self.stash, self.layout)
            carry.pend[self.lsel] = torch.as_tensor(pend, dtype=torch.int32).to(DEVICE)
            st = self.state0.clone()
            gdn_carry_flush([st], [carry], self.sel, validate=True, **self.lay)
            folded = st[self.lsel]
            o_dec = torch.stack([gdn_decode(st, *r, state_indices=self.sel, **self.lay)
                                 for r in self.row_args], 1)
            s = self.lsel[:self.n]
            f64 = {k: getattr(carry, k)[s].to("cpu", torch.float64) for k in ("u", "g", "k")}
            sub = ref_carry.RefCarry(**f64, pend=carry.pend[s].to("cpu", torch.int64))
            state_ref = self.state_kv[s].to("cpu", torch.float64)
            o_ref, _ = ref_carry.verify(state_ref, sub, *self.cpu_args, torch.arange(self.n),
                                        lazy=lazy, state_dtype=self.ref_sdt)
            self._carry[key] = dict(pend=pend, wb=wb, lazy=lazy, carry=carry, o_dec=o_dec,
                                    folded=folded, o_ref=o_ref, state_ref=state_ref, u_ref=sub.u)
        return self._carry[key]

    def check_carry(self, name: str, cc: dict, form: str, tag: str = "",
                    untouched: bool = False):
        """A validated ``gdn_carry_verify`` of ``cc`` (``carry_case``) checked: engaged as the
        protocol, outputs, states and stash against float64 (``what`` + ``tag``), outputs and
        written-back states bitwise against plain decoding (``untouched``: also the states
        without a write-back, and the written-back ones only where there are some).
        ``(rows, state pool, carry, o, engaged)``."""
        st, carry, wb = self.state0.clone(), clone_carry(cc["carry"]), cc["wb"]
        o, eng = gdn_carry_verify(st, carry, *self.args, slot_tab=self.sel, form=form,
                                  lazy=cc["lazy"], validate=True, eager_max_pending=None,
                                  **self.lay)
        s = self.lsel[:self.n]
        rows = [P.flag(name, "engaged_as_protocol",
                       eng.cpu().tolist() == np.where(wb, 2, 1).tolist(), "engaged" + tag)]
        rows += error_rows(name, o[:self.n], cc["o_ref"], tol=self.otol, what="o" + tag)
        rows += error_rows(name, st[s], self.to_layout(cc["state_ref"]), tol=self.stol,
                           what="state" + tag)
        rows += error_rows(name, carry.u[s], cc["u_ref"], what="stash u" + tag, tol=self.stol)
        wbm, st_b = torch.as_tensor(wb, device=DEVICE), st[self.lsel]
        if untouched and not wb.all():
            rows.append(P.flag(name, "bitwise_vs_decode",
                               bitwise_equal(st_b[~wbm], self.state0[self.lsel][~wbm]),
                               "state untouched without write-back" + tag))
        rows.append(P.flag(name, "bitwise_vs_decode", bitwise_equal(o, cc["o_dec"]), "o" + tag))
        if not untouched or wb.any():
            rows.append(P.flag(name, "bitwise_vs_decode",
                               bitwise_equal(st_b[wbm], cc["folded"][wbm]),
                               "written-back state" + tag))
        return rows, st, carry, o, eng

    def decode_plans(self, name: str):
        """The decodes through launch plans (``gdn_decode_plan``), bitwise against ``decoded``
        on their second call (the first that skips Triton's launcher on a GPU): ``(row,
        plans)``."""
        o_dec, st_sel = self.decoded()[:2]
        st = self.state0.clone()
        plans = [gdn_decode_plan(st, *r, state_indices=self.sel, **self.lay)
                 for r in self.row_args]
        for _ in range(2):
            st.copy_(self.state0)
            o = torch.stack([p().clone() for p in plans], 1)
        ok = bitwise_equal(o, o_dec) and bitwise_equal(st[self.lsel], st_sel)
        return P.flag(name, "bitwise_vs_decode", ok, "o and state"), plans

    def carry_plan(self, name: str, cc: dict, form: str, checked: tuple, tag: str = ""):
        """The verify of ``cc`` through a launch plan (``gdn_carry_verify_plan``), bitwise on
        its second call against ``checked`` (``check_carry``'s state, carry, o, engaged):
        ``(row, plan)``."""
        st, carry = self.state0.clone(), clone_carry(cc["carry"])
        plan = gdn_carry_verify_plan(st, carry, *self.args, slot_tab=self.sel, form=form,
                                     lazy=cc["lazy"], **self.lay)
        for _ in range(2):
            st.copy_(self.state0)
            carry.buf.copy_(cc["carry"].buf)
            o, eng = plan()
        ok = (bitwise_equal(o, checked[2]) and bitwise_equal(eng, checked[3])
              and bitwise_equal(st, checked[0]) and bitwise_equal(carry.buf, checked[1].buf))
        return P.flag(name, "bitwise_vs_launcher", ok, "o, engaged, state, stash" + tag), plan

    def flashinfer(self, provider: str):
        """Run FlashInfer's ``provider`` (``flashinfer_decode``, ``flashinfer_mtp_snapshots`` or
        ``_frozen``: the pool left as it was) once on a copy of the V-major pool: ``(run, bufs,
        pool)``."""
        pool, (q, k, v) = self.state0.clone(), self.args[:3]
        A_log, a, dt_bias, b = self.gate
        gate = (A_log, a[:self.B, :self.K], dt_bias, b[:self.B, :self.K])
        if provider == FLASHINFER_DECODE.name:
            run, bufs = peers.flashinfer_decode_runner(q, k, v, *gate, pool, self.sel,
                                                       scale=self.D ** -0.5)
        else:
            run, bufs = peers.flashinfer_mtp_runner(q, k, v, *gate, pool, self.sel,
                                                    scale=self.D ** -0.5, frozen=True,
                                                    snapshots=provider.endswith("snapshots"))
        run()
        return run, bufs, pool

    def fi_ref(self, n: int | None = None, layout: str = "kv"):
        """The float64 chain with FlashInfer's own gating (``g, beta`` recomputed in float64
        from the raw inputs) on the first ``n`` (default ``self.n``) sequences, states in
        ``layout``: ``(o, state, snapshots)``."""
        n = self.n if n is None else n
        if (n, layout) not in self._fi:
            A_log, a, dt_bias, b = (t.cpu() for t in self.gate)
            g, beta = peers.fused_gating(A_log, a[:n, :self.K], dt_bias, b[:n, :self.K],
                                         dtype=torch.float64)
            sub = (self.state_kv if layout == "kv" else self.state0)[self.lsel[:n]]
            self._fi[(n, layout)] = gdn_chain_ref(
                sub.to("cpu", torch.float64), *(t[:n].cpu() for t in self.args[:3]), g, beta,
                state_layout=layout, state_dtype=self.ref_sdt)
        return self._fi[(n, layout)]
