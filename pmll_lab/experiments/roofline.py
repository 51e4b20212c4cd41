"""The roofline notebook (issue 5): every verify kernel and peer against the copy roofline, in one run.

What one run measures (SPEC §4; issue 5's targets):

- the **roofline**: the device copy bandwidth (``pmll_lab.bench.copy_bandwidth``);
- for each point ``(K, B, HK, HV, head_dim, dtype, provider)`` a **provider** verifying the same
  ``K`` draft rows of ``B`` sequences from the same state:

  ``decodes``              ``K`` successive ``gdn_decode`` launches (``K * 2*Hb`` per sequence);
  ``chain_snapshots``      ``gdn_chain`` with the ``K-1`` snapshots (``(K+1)*Hb``; not at ``K=1``);
  ``carry_{exact,wy}_eager``  ``gdn_carry_verify``, eager: the state is written back whenever
                           rows are pending, which in the steady state is every verify;
  ``carry_{exact,wy}_lazy``   the lazy form, timed twice: with pending counts that leave the
                           state alone (``:nowb``) and with pending counts that force a
                           write-back (``:wb``); the provider's own figure is the **amortised**
                           time ``(1-f)*t_nowb + f*t_wb`` (bytes likewise), ``f`` the write-back
                           frequency of the acceptance process below;
  ``fla_fused_recurrent``  FLA's ``fused_recurrent_gated_delta_rule`` over the same ``K`` rows
                           from the same state (GPU and fla-core only; a speed reference that
                           keeps no snapshots, so it cannot roll back).

- **PMLL** ``pmll_read`` / ``pmll_write`` at rings several times the L2: the notebook runs
  ``pmll_lab.experiments.pmll.ring_point`` (its own check-then-time point) on those sizes.

**Acceptance process** (host simulation, seeded, ``acceptance``): a verify of ``K`` rows checks
the last accepted token and ``K-1`` drafts; ``a = 1 +`` leading drafts accepted, each with
probability ``alpha``, with ``alpha`` chosen so that the mean accepted length is ``mean_accept``
(default 3.3, Qwen3-Next's MTP figure) at ``accept_K`` (default 4) rows; the same ``alpha`` for
every ``K``. Running the pending count of many slots through the protocol (eager: write back when
``p > 0``; lazy: when ``p + K > CAP``) gives the write-back frequency ``f`` and the stationary
distribution of ``p`` before a verify; each timed launch draws its slots' pending counts from
that distribution (conditioned on no write-back / write-back for the two lazy timings).

**Checks before timing** (llm.c habit, STYLE.md): every provider is checked before it is timed,
and a failed check raises ``CheckFailed`` (the point is stored as failed, never plotted):

- against the float64 references on the first ``N_REF`` sequences (``gdn_chain_ref``; the carry
  protocol reference ``pmll_lab.reference.carry.verify`` with the same stash and pending counts);
- against ``K`` decode launches over all ``B`` sequences: the chain (outputs, final state, every
  snapshot) and the exact carry (outputs; the written-back state equals the state with the
  pending rows folded, ``gdn_carry_flush``) **bitwise**; the WY carry and FLA within tolerances;
  a lazy verify that does not write back must leave the state bit for bit as it was.

**Bytes** (SPEC §4, the fewest each launch must move; ``Hb = HV*kd*vd*4``): decodes
``K*(2*Hb + io)``; chain ``(K+1)*Hb + K*io``; carry ``Hb`` read, ``Hb`` written per write-back,
``p`` stash rows read and ``K`` written (a row: ``u``, ``g``, ``k`` of all heads, fp32), ``K*io``
and three int32 per sequence; FLA ``2*Hb + K*io``. ``io`` = one row's q, k, v, g, beta and o.
The **roofline floor** of a verify is ``Hb + K*(stash row + io)`` per sequence over the copy
bandwidth: the state read once, nothing written back.

Inputs: one ``gdn_inputs`` draw per shape for the largest ``B`` and ``K`` of the run (slots
``[S, ...]``, rows ``[S, Kmax, ...]``), reused by every ``(K, B)`` as views (``q[:B, :K]``) and by
every provider; the decode baseline and the carry references of one ``(K, B)`` are computed once
and shared by its providers. ``release()`` frees these caches.

At ``B = 1`` on a GPU every timed launch also gets a CUDA-graph replay figure
(``pmll_lab.bench.time_graph``, column ``graph_us``) next to its ``do_bench`` time, which
includes the host launch.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import (
    H200_L2_BYTES,
    bitwise_equal, copy_bandwidth, error_rows, throughput_rows, time_graph, time_launch,
)
from pmll_lab.carry import (
    GDN_CARRY_CAP, GdnCarry, gdn_carry_flush, gdn_carry_verify, gdn_carry_verify_plan,
)
from pmll_lab.gdn import (
    carry_stash_bytes, chain_bytes, decodes_bytes, gdn_chain, gdn_chain_ref, gdn_decode,
    gdn_decode_plan, row_io_bytes, state_bytes,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.peers import (  # noqa: F401  (fla_supports_gva: used by the notebook)
    fla_available, fla_fused_recurrent, fla_runner, fla_supports_gva, fla_version,
)
from pmll_lab.reference import carry as ref_carry
from pmll_lab.sweep import CheckFailed, grid, speed_rows
from pmll_lab.experiments.carry import accept_counts, alpha_for_mean, mean_accept_len
from pmll_lab.experiments.common import failed_points as _failed_points

CAP = GDN_CARRY_CAP
O_TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs against the float64 reference, per input dtype (the outputs are
rounded once to that dtype; tests/test_gdn.py, tests/test_carry.py)."""
STATE_TOL = 1e-5
"""rel_l2 tolerance of fp32 states, snapshots and stash rows against the float64 reference."""
WY_TOL = 1e-4
"""rel_l2 tolerance of the WY form against the exact form (fp32 rounding; tests/test_carry.py)."""
N_REF = 2
"""Sequences checked against the float64 references (the decode comparisons cover all ``B``)."""
WARMUP_MS, REP_MS = 10, 50
"""``do_bench`` warm-up and measurement windows (ms): the full preset times ~350 launches."""
CPU_REPS = 1
"""Interpreter calls timed after one warm-up call (CPU wall time says nothing about GPU speed)."""
PLAN_MAX_B = 1
"""Batch widths up to which the decodes and carry verifies are also checked and timed through
launch plans (``gdn_decode_plan``, ``gdn_carry_verify_plan``: arguments bound once, later calls
straight to the compiled kernel), as kernel ``<name>:plan``: the host-bound small-batch path."""
PLAN_SUFFIX = ":plan"
L2_BYTES = H200_L2_BYTES
"""PMLL targets count launches moving >= 4x the H200's L2 (``bench.H200_L2_BYTES``)."""

PROVIDERS = ("decodes", "chain_snapshots", "carry_exact_eager", "carry_exact_lazy",
             "carry_wy_eager", "carry_wy_lazy", "fla_fused_recurrent")
LABELS = {
    "decodes": "K x decode (ours)", "chain_snapshots": "chain + snapshots (ours)",
    "carry_exact_eager": "carry exact, eager", "carry_exact_lazy": "carry exact, lazy (amortised)",
    "carry_wy_eager": "carry WY, eager", "carry_wy_lazy": "carry WY, lazy (amortised)",
    "fla_fused_recurrent": "FLA fused_recurrent",
}
STYLE = {"decodes": ("C4", "-", "v"), "chain_snapshots": ("C2", "-", "s"),
         "carry_exact_eager": ("C0", "--", "o"), "carry_exact_lazy": ("C0", "-", "o"),
         "carry_wy_eager": ("C1", "--", "D"), "carry_wy_lazy": ("C1", "-", "D"),
         "fla_fused_recurrent": ("C3", ":", "x")}
MAIN_SHAPE = dict(HK=16, HV=32, head_dim=128, dtype="bfloat16")
"""Issue 5's target shape (Qwen3-Next's GDN heads)."""
SHAPE_KEYS = ("HK", "HV", "head_dim", "dtype")


# ---- acceptance process ------------------------------------------------------------------------

@lru_cache(maxsize=64)
def acceptance(K: int, mean_accept: float = 3.3, accept_K: int = 4, cap: int = CAP,
               seed: int = 0, seqs: int = 512, steps: int = 400, burn_in: int = 20) -> dict:
    """Host simulation of the pending counts under the acceptance process (module docstring).

    ``seqs`` slots start at ``p = 0`` and run ``burn_in + steps`` verify + accept steps of each
    form. Returns ``alpha``, ``mean_accept`` (at this ``K``) and, per form ``eager`` / ``lazy``:
    ``{form}_wb`` (write-backs per verify), ``{form}_mean_pend`` and ``{form}_hist`` (tuple: the
    stationary distribution of ``p`` before a verify, ``p = 0..cap``)."""
    if not 1 <= K <= cap:
        raise ValueError(f"K: must lie in [1, CAP={cap}], got {K}")
    alpha = alpha_for_mean(mean_accept, accept_K)
    out = {"alpha": alpha, "mean_accept": mean_accept_len(alpha, K), "K": K}
    for form in ("eager", "lazy"):
        rng = np.random.default_rng([seed, K, form == "lazy"])
        p = np.zeros(seqs, dtype=np.int64)
        hist = np.zeros(cap + 1)
        wbs = 0
        for step in range(burn_in + steps):
            wb = (p + K > cap) if form == "lazy" else (p > 0)
            if step >= burn_in:
                hist += np.bincount(p, minlength=cap + 1)[:cap + 1]
                wbs += int(wb.sum())
            a = accept_counts(rng, seqs, K, alpha)
            p = np.where(wb, a, p + a)
        n = steps * seqs
        out[f"{form}_wb"] = wbs / n
        out[f"{form}_hist"] = tuple(hist / hist.sum())
        out[f"{form}_mean_pend"] = float((np.arange(cap + 1) * hist).sum() / hist.sum())
    return out


def acceptance_table(Ks, mean_accept: float = 3.3, accept_K: int = 4, seed: int = 0) -> pd.DataFrame:
    """One row per ``K``: ``alpha``, mean accepted length, write-back frequency and mean pending
    rows of the eager and lazy forms: the frequencies the amortised lazy figures use."""
    rows = []
    for K in sorted(set(int(k) for k in Ks)):
        a = acceptance(K, mean_accept, accept_K, seed=seed)
        rows.append({"K": K, "alpha": a["alpha"], "mean accepted rows": a["mean_accept"],
                     "eager write-back freq": a["eager_wb"], "eager mean pending": a["eager_mean_pend"],
                     "lazy write-back freq": a["lazy_wb"], "lazy mean pending": a["lazy_mean_pend"]})
    return pd.DataFrame(rows).round(3)


def draw_pending(hist, B: int, K: int, rng: np.random.Generator, *, write_back: bool | None,
                 lazy: bool = True, cap: int = CAP) -> np.ndarray:
    """``B`` pending counts drawn from ``hist`` (over ``0..cap``); with ``write_back`` True/False
    conditioned on the lazy verify writing back / not (``p + K > cap``). When the condition has
    no mass (e.g. no pending count avoids a write-back at ``K = CAP``) the nearest legal count is
    used: ``p = 0`` without a write-back, ``p = cap - K + 1`` with one."""
    h = np.asarray(hist, dtype=float).copy()
    p = np.arange(cap + 1)
    if write_back is not None:
        wb = (p + K > cap) if lazy else (p > 0)
        h[wb != write_back] = 0.0
    if h.sum() <= 0:
        return np.full(B, 0 if not write_back else cap - K + 1, dtype=np.int64)
    return rng.choice(cap + 1, size=B, p=h / h.sum()).astype(np.int64)


# ---- bytes -------------------------------------------------------------------------------------

def stash_row_bytes(HV: int, kd: int, vd: int) -> int:
    """One stash row of all value heads: ``u [HV, vd]``, ``g [HV]``, ``k [HV, kd]`` fp32."""
    return carry_stash_bytes(HV, kd, vd, cap=1)


def carry_bytes(pend, write_back, K: int, HK: int, HV: int, D: int, dtype) -> int:
    """SPEC §4 bytes of one carry verify launch (module docstring): per sequence ``Hb`` read,
    ``Hb`` written if it writes back, ``p`` stash rows read, ``K`` written, ``K`` rows of
    inputs/outputs and three int32 (slot, pend, engaged)."""
    pend, wb = np.asarray(pend), np.asarray(write_back)
    B = len(pend)
    hb, row = state_bytes(HV, D, D), stash_row_bytes(HV, D, D)
    return int(B * hb + int(wb.sum()) * hb + (int(pend.sum()) + B * K) * row
               + B * K * row_io_bytes(HK, HV, D, D, dtype) + 12 * B)


def fla_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype) -> int:
    """FLA over ``K`` rows: the state read and the final state written (``2*Hb``) + rows."""
    return B * (2 * state_bytes(HV, D, D) + K * row_io_bytes(HK, HV, D, D, dtype))


def floor_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype) -> int:
    """The roofline floor of a ``K``-row verify: per sequence the state read once, ``K`` stash
    rows written, ``K`` rows of inputs/outputs (no write-back, nothing pending)."""
    return B * (state_bytes(HV, D, D)
                + K * (stash_row_bytes(HV, D, D) + row_io_bytes(HK, HV, D, D, dtype)))


def nosnap_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype) -> int:
    """State read and written once (``2*Hb``) plus ``K`` rows: decode at ``K = 1``, FLA."""
    return fla_bytes(B, K, HK, HV, D, dtype)


# ---- points ------------------------------------------------------------------------------------

def points(grids: list[dict], *, seed: int = 0, mean_accept: float = 3.3, accept_K: int = 4,
           fla: bool | None = None) -> list[dict]:
    """Expand grids into points, one per provider.

    Each grid: axes ``K, B, head_dim, heads`` (list of ``(HK, HV)``), ``dtype``, and optionally
    ``providers`` (default all of ``PROVIDERS``). ``chain_snapshots`` is dropped at ``K = 1``
    (it is one decode), ``fla_fused_recurrent`` unless ``fla`` (default ``fla_available()``).
    Every point also carries ``slots`` and ``rows_max``: the largest ``B`` and ``K`` of its shape
    over all grids (one input draw per shape), ``seed``, ``mean_accept``, ``accept_K``.
    Points are ordered shape, ``K``, ``B``, provider, so that the providers of one ``(K, B)``
    run one after another and share its inputs and references. Duplicates dropped.
    """
    fla = fla_available() if fla is None else fla
    pts, seen = [], set()
    for g in grids:
        axes = dict(g)
        heads = axes.pop("heads")
        provs = list(axes.pop("providers", PROVIDERS))
        bad = [p for p in provs if p not in PROVIDERS]
        if bad:
            raise ValueError(f"providers: unknown {bad}; known {list(PROVIDERS)}")
        for p in grid(**axes, heads=[tuple(h) for h in heads]):
            hk, hv = p.pop("heads")
            base = dict(K=int(p["K"]), B=int(p["B"]), HK=int(hk), HV=int(hv),
                        head_dim=int(p["head_dim"]), dtype=str(p["dtype"]))
            for prov in provs:
                if prov == "chain_snapshots" and base["K"] == 1:
                    continue
                if prov == "fla_fused_recurrent" and not fla:
                    continue
                q = dict(base, provider=prov)
                key = tuple(sorted(q.items()))
                if key not in seen:
                    seen.add(key)
                    pts.append(q)
    shape_of = lambda p: tuple(p[k] for k in SHAPE_KEYS)  # noqa: E731
    slots, rows = {}, {}
    for p in pts:
        s = shape_of(p)
        slots[s] = max(slots.get(s, 0), p["B"])
        rows[s] = max(rows.get(s, 0), p["K"])
    order = {s: i for i, s in enumerate(dict.fromkeys(shape_of(p) for p in pts))}
    pts.sort(key=lambda p: (order[shape_of(p)], p["K"], p["B"], PROVIDERS.index(p["provider"])))
    for p in pts:
        p.update(slots=slots[shape_of(p)], rows_max=rows[shape_of(p)], seed=int(seed),
                 mean_accept=float(mean_accept), accept_K=int(accept_K))
    return pts


# ---- shared inputs and references --------------------------------------------------------------

_SHAPE: dict = {}
_CASE: dict = {}


def release() -> None:
    """Drop the cached inputs, decode baselines and carry references (frees device memory)."""
    _SHAPE.clear()
    _CASE.clear()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


def fill_stash(carry: GdnCarry, seed: int) -> None:
    """Realistic stash rows (so that pending counts can be set by hand): corrections ``u`` of a
    verify's scale, log decays ``g <= 0``, unit keys ``k``; seeded, drawn on the CPU."""
    gen = torch.Generator().manual_seed(int(seed))
    carry.u.copy_((torch.randn(carry.u.shape, generator=gen) * 0.3).to(carry.device))
    carry.g.copy_((-F.softplus(torch.randn(carry.g.shape, generator=gen))).to(carry.device))
    carry.k.copy_(ref_carry.l2norm(torch.randn(carry.k.shape, generator=gen)).to(carry.device))


def clone_carry(c: GdnCarry) -> GdnCarry:
    return GdnCarry(c.buf.clone(), c.pend.clone(), c.num_v_heads, c.k_dim, c.v_dim, c.cap)


def _shape(point: dict) -> dict:
    key = (point["seed"], point["slots"], point["rows_max"], point["HK"], point["HV"],
           point["head_dim"], point["dtype"])
    if key not in _SHAPE:
        _SHAPE.clear()      # one shape at a time: the previous shape's tensors are dropped
        _CASE.clear()
        S, Kmax, HK, HV, D = (int(point[n]) for n in ("slots", "rows_max", "HK", "HV", "head_dim"))
        x = gdn_inputs(int(point["seed"]), S, HK, HV, D, D, rows=Kmax,
                       dtype=getattr(torch, point["dtype"]))
        stash = GdnCarry.empty(S, HV, D, D, cap=CAP)
        fill_stash(stash, int(point["seed"]) + 7)
        _SHAPE[key] = dict(x=x, stash=stash)
    return _SHAPE[key]


class _Case:
    """One ``(shape, K, B)``: input views, float64 references on ``N_REF`` sequences, and (on
    first use) the decode baseline and the carry references per pending-count variant."""

    def __init__(self, point: dict, shape: dict):
        self.K, self.B, self.HK, self.HV, self.D = (
            int(point[n]) for n in ("K", "B", "HK", "HV", "head_dim"))
        self.dname = point["dtype"]
        self.dtype = getattr(torch, self.dname)
        self.seed = int(point["seed"])
        self.acc = acceptance(self.K, float(point["mean_accept"]), int(point["accept_K"]),
                              seed=self.seed)
        x = shape["x"]
        K, B = self.K, self.B
        self.state0 = x["state"]                               # [S, HV, kd, vd], never written
        self.sel = x["state_indices"][:B].contiguous()         # B distinct slots of S
        self.lsel = self.sel.long()
        self.args = tuple(x[n][:B, :K] for n in ("q", "k", "v", "g", "beta"))
        self.row_args = [tuple(t[:, r] for t in self.args) for r in range(K)]
        self.stash = shape["stash"]
        self.n = min(B, N_REF)
        self.otol = O_TOL[self.dname]
        sub = self.state0[self.lsel[:self.n]].to("cpu", torch.float64)
        self.cpu_args = tuple(t[:self.n].cpu() for t in self.args)
        self.o_ref, s_ref, self.i_ref = gdn_chain_ref(sub, *self.cpu_args)
        self.s_ref = s_ref
        self._dec = None
        self._carry: dict = {}

    def io(self) -> dict:
        return dict(num_k_heads=self.HK, num_v_heads=self.HV, k_dim=self.D, v_dim=self.D,
                    dtype=self.dtype)

    def decoded(self):
        """``K`` ``gdn_decode`` launches from ``state0`` (validated): ``(o [B, K, HV, vd],
        final states [B, ...], snapshots: list of K-1 states [B, ...])``."""
        if self._dec is None:
            st = self.state0.clone()
            outs, snaps = [], []
            for r in range(self.K):
                outs.append(gdn_decode(st, *self.row_args[r], state_indices=self.sel,
                                       validate=True))
                if r < self.K - 1:
                    snaps.append(st[self.lsel])
            self._dec = (torch.stack(outs, 1), st[self.lsel], snaps)
            del st
        return self._dec

    def carry_case(self, variant: str) -> dict:
        """Pending counts for ``variant`` (``eager``, ``nowb``, ``wb``) drawn from the
        acceptance process, the carry holding them, and its references: plain decoding after
        folding (``o_dec``, ``folded`` states of the B slots) and the float64 protocol
        reference on ``N_REF`` sequences (``o``, state after the verify, stash ``u``)."""
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
        gdn_carry_flush([st], [carry], self.sel, validate=True)
        folded = st[self.lsel]
        outs = [gdn_decode(st, *self.row_args[r], state_indices=self.sel) for r in range(self.K)]
        del st
        s = self.lsel[:self.n]
        sub_state = self.state0[s].to("cpu", torch.float64)
        sub = ref_carry.RefCarry(u=carry.u[s].to("cpu", torch.float64),
                                 g=carry.g[s].to("cpu", torch.float64),
                                 k=carry.k[s].to("cpu", torch.float64),
                                 pend=carry.pend[s].to("cpu", torch.int64))
        o_ref, _ = ref_carry.verify(sub_state, sub, *self.cpu_args, torch.arange(self.n), lazy=lazy)
        self._carry[variant] = dict(pend=pend, wb=wb, lazy=lazy, carry=carry,
                                    o_dec=torch.stack(outs, 1), folded=folded, o_ref=o_ref,
                                    state_ref=sub_state, u_ref=sub.u)
        return self._carry[variant]


def _case(point: dict) -> _Case:
    shape = _shape(point)
    key = tuple(point[n] for n in ("seed", "slots", "rows_max", "HK", "HV", "head_dim", "dtype",
                                    "K", "B", "mean_accept", "accept_K"))
    if key not in _CASE:
        _CASE.clear()
        _CASE[key] = _Case(point, shape)
    return _CASE[key]


# ---- checking and timing -----------------------------------------------------------------------

def _require(rows: list[dict]) -> None:
    """Raise ``CheckFailed`` (carrying ``rows``) if any row failed: before anything is timed."""
    bad = [r for r in rows if r.get("passed") is False]
    if bad:
        what = ", ".join(sorted({f"{r['kernel']}:{r.get('what', '')}:{r['metric']}" for r in bad}))
        raise CheckFailed(f"failed checks: {what}", rows)


def _flag(kernel: str, metric: str, ok: bool, what: str) -> dict:
    return {"kernel": kernel, "metric": metric, "value": float(ok), "passed": bool(ok), "what": what}


def _on_cuda() -> bool:
    return DEVICE.type == "cuda" and not INTERPRET


def _graph(fn) -> float | None:
    """CUDA-graph replay time of ``fn`` (us), or None (CPU, or capture failed: the do_bench
    figure stands on its own)."""
    if not _on_cuda():
        return None
    try:
        return time_graph(fn)
    except Exception:  # noqa: BLE001 - a capture that fails must not lose the do_bench figure
        torch.cuda.synchronize()
        return None


def _time(fn, B: int) -> tuple[dict, float | None]:
    t = time_launch(fn, warmup_ms=WARMUP_MS, rep_ms=REP_MS, cpu_reps=CPU_REPS)
    return t, (_graph(fn) if B == 1 else None)


def _speed_rows(kernel: str, timing: dict, graph_us, nbytes: int, **extra) -> list[dict]:
    """``throughput_rows`` plus the bytes, the roofline floor time (GPU), the graph replay time
    (B = 1, GPU) and ``extra`` on the time row."""
    rows = throughput_rows(kernel, timing, nbytes)
    roof = copy_bandwidth()
    for r in rows:
        r.update(extra)
        r["bytes"] = int(nbytes)
        if r["metric"] == "time_us":
            if graph_us is not None:
                r["graph_us"] = float(graph_us)
            if roof:
                r["floor_us"] = nbytes / (roof * 1e3)
    return rows


def _point_decodes(c: _Case) -> list[dict]:
    o_dec, st_sel, _ = c.decoded()
    name = "decodes"
    rows = (error_rows(name, o_dec[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st_sel[:c.n], c.s_ref[:c.n], tol=STATE_TOL, what="state"))
    plans = None
    if c.B <= PLAN_MAX_B:
        # the same K decodes through launch plans (lean host path): checked bitwise on their
        # second call, the first that skips Triton's launcher on a GPU
        st_p = c.state0.clone()
        plans = [gdn_decode_plan(st_p, *c.row_args[r], state_indices=c.sel) for r in range(c.K)]
        for _ in range(2):
            st_p.copy_(c.state0)
            o_p = torch.stack([p().clone() for p in plans], 1)
        rows.append(_flag(f"{name}{PLAN_SUFFIX}", "bitwise_vs_decode",
                          bitwise_equal(o_p, o_dec) and bitwise_equal(st_p[c.lsel], st_sel),
                          "o and state"))
    _require(rows)
    st = c.state0.clone()

    def run():
        for r in range(c.K):
            gdn_decode(st, *c.row_args[r], state_indices=c.sel)

    t, gr = _time(run, c.B)
    nbytes = decodes_bytes(c.B, c.K, **c.io())
    rows += _speed_rows(name, t, gr, nbytes, variant="")
    if plans is not None:
        def run_plans():
            for p in plans:
                p()

        t, gr = _time(run_plans, c.B)
        rows += _speed_rows(f"{name}{PLAN_SUFFIX}", t, gr, nbytes, variant="launch plan")
    return rows


def _point_chain(c: _Case) -> list[dict]:
    name = "chain_snapshots"
    st = c.state0.clone()
    inter = torch.empty(c.B, c.K - 1, c.HV, c.D, c.D, device=DEVICE)
    o = gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter, validate=True)
    rows = (error_rows(name, o[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st[c.lsel[:c.n]], c.s_ref, tol=STATE_TOL, what="state")
            + error_rows(name, inter[:c.n], c.i_ref, tol=STATE_TOL, what="snapshots"))
    o_dec, st_dec, snaps = c.decoded()
    rows += [_flag(name, "bitwise_vs_decode", bitwise_equal(o, o_dec), "o"),
             _flag(name, "bitwise_vs_decode", bitwise_equal(st[c.lsel], st_dec), "state"),
             _flag(name, "bitwise_vs_decode",
                   all(bitwise_equal(inter[:, t], snaps[t]) for t in range(c.K - 1)), "snapshots")]
    _require(rows)

    def run():
        gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter)

    t, gr = _time(run, c.B)
    return rows + _speed_rows(name, t, gr, chain_bytes(c.B, c.K, **c.io()), variant="")


VARIANT_NAMES = {"eager": "eager", "nowb": "no write-back", "wb": "write-back"}


def _point_carry(c: _Case, form: str, lazy: bool) -> list[dict]:
    name = f"carry_{form}_{'lazy' if lazy else 'eager'}"
    variants = ("nowb", "wb") if lazy else ("eager",)
    rows: list[dict] = []
    ready = []
    for var in variants:
        cc = c.carry_case(var)
        tag = "" if var == "eager" else f" ({VARIANT_NAMES[var]})"
        st, carry = c.state0.clone(), clone_carry(cc["carry"])
        o, eng = gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy,
                                  validate=True, eager_max_pending=None)
        wb = cc["wb"]
        want_eng = torch.as_tensor(np.where(wb, 2, 1), dtype=torch.int32)
        rows.append(_flag(name, "engaged_as_protocol", torch.equal(eng.cpu(), want_eng),
                          "engaged" + tag))
        otol = c.otol if form == "exact" else max(c.otol, WY_TOL)
        s = c.lsel[:c.n]
        rows += error_rows(name, o[:c.n], cc["o_ref"], tol=otol, what="o" + tag)
        rows += error_rows(name, st[s], cc["state_ref"], tol=STATE_TOL, what="state" + tag)
        rows += error_rows(name, carry.u[s], cc["u_ref"],
                           tol=STATE_TOL if form == "exact" else WY_TOL, what="stash u" + tag)
        # Over all B sequences: sequences that do not write back leave the state as it was;
        # those that do store the state with their pending rows folded (flagged only where
        # such sequences exist, so that no flag passes vacuously).
        wbm = torch.as_tensor(wb, device=DEVICE)
        st_b = st[c.lsel]
        if not wb.all():
            rows.append(_flag(name, "bitwise_vs_decode",
                              bitwise_equal(st_b[~wbm], c.state0[c.lsel][~wbm]),
                              "state untouched without write-back" + tag))
        if form == "exact":
            rows.append(_flag(name, "bitwise_vs_decode", bitwise_equal(o, cc["o_dec"]), "o" + tag))
            if wb.any():
                rows.append(_flag(name, "bitwise_vs_decode",
                                  bitwise_equal(st_b[wbm], cc["folded"][wbm]),
                                  "written-back state" + tag))
        else:
            rows += error_rows(name, o, cc["o_dec"], tol=otol, what="o vs decode" + tag)
            if wb.any():
                rows += error_rows(name, st_b[wbm], cc["folded"][wbm], tol=STATE_TOL,
                                        what="written-back state" + tag)
        del st_b
        plan = None
        if c.B <= PLAN_MAX_B:
            # the same verify through a launch plan (lean host path), checked bitwise against
            # the launch above on its second call (the first that skips Triton's launcher)
            st_p, carry_p = c.state0.clone(), clone_carry(cc["carry"])
            plan = gdn_carry_verify_plan(st_p, carry_p, *c.args, slot_tab=c.sel, form=form,
                                         lazy=lazy)
            for _ in range(2):
                st_p.copy_(c.state0)
                carry_p.buf.copy_(cc["carry"].buf)
                o_p, e_p = plan()
            rows.append(_flag(f"{name}{PLAN_SUFFIX}", "bitwise_vs_launcher",
                              bitwise_equal(o_p, o) and bitwise_equal(e_p, eng)
                              and bitwise_equal(st_p, st) and bitwise_equal(carry_p.buf, carry.buf),
                              "o, engaged, state, stash" + tag))
        nbytes = carry_bytes(cc["pend"], wb, c.K, c.HK, c.HV, c.D, c.dtype)
        ready.append((var, st, carry, nbytes, float(np.mean(cc["pend"])), float(np.mean(wb)),
                      plan))
    _require(rows)

    timed = {}
    for var, st, carry, nbytes, mean_pend, wb_frac, plan in ready:
        def run(st=st, carry=carry):
            gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy)

        t, gr = _time(run, c.B)
        timed[var] = (t, gr, nbytes)
        kname = name if var == "eager" else f"{name}:{var}"
        rows += _speed_rows(kname, t, gr, nbytes, variant=VARIANT_NAMES[var],
                            mean_pend=mean_pend, wb_frac=wb_frac)
        if plan is not None:
            t, gr = _time(plan, c.B)
            rows += _speed_rows(f"{kname}{PLAN_SUFFIX}", t, gr, nbytes,
                                variant=f"{VARIANT_NAMES[var]}, launch plan",
                                mean_pend=mean_pend, wb_frac=wb_frac)
    if lazy:
        f = float(c.acc["lazy_wb"])
        (t0, g0, b0), (t1, g1, b1) = timed["nowb"], timed["wb"]
        comb = {k: (1 - f) * float(t0[k]) + f * float(t1[k]) for k in ("median_us", "p20_us", "p80_us")}
        comb["timer"] = t0["timer"]
        graph = None if g0 is None or g1 is None else (1 - f) * g0 + f * g1
        rows += _speed_rows(name, comb, graph, round((1 - f) * b0 + f * b1), variant="amortised",
                            wb_frac=f, mean_pend=float(c.acc["lazy_mean_pend"]))
    return rows


def _point_fla(c: _Case) -> list[dict]:
    name = "fla_fused_recurrent"
    if fla_fused_recurrent() is None or not _on_cuda():
        raise RuntimeError("fla_fused_recurrent: needs a GPU and an importable fla-core")
    q, k, v, g, beta = (t.contiguous() for t in c.args)
    run, gva = fla_runner(q, k, v, g, beta, c.state0[c.lsel].contiguous(), scale=c.D ** -0.5)

    o_f, h_f = run()
    o_dec, st_dec, _ = c.decoded()
    rows = (error_rows(name, o_f[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, h_f[:c.n], c.s_ref, tol=STATE_TOL, what="state")
            + error_rows(name, o_f, o_dec, tol=c.otol, what="o vs decode")
            + error_rows(name, h_f, st_dec, tol=STATE_TOL, what="state vs decode"))
    _require(rows)
    del o_f, h_f
    t, gr = _time(run, c.B)
    version = fla_version()
    return rows + _speed_rows(name, t, gr, fla_bytes(c.B, c.K, c.HK, c.HV, c.D, c.dtype),
                              variant="", fla_gva=gva, fla_version=version)


def gdn_point(point: dict) -> list[dict]:
    """Check, then time, one provider at one ``(shape, K, B)`` (module docstring).

    Point keys: ``K, B, HK, HV, head_dim, dtype, provider, slots, rows_max, seed, mean_accept,
    accept_K`` (``points`` fills them). Returns tidy rows: error and flag rows (``passed``),
    then ``time_us`` / ``gbps`` / ``roofline_frac`` rows (``bytes``; ``floor_us`` and, at
    ``B = 1``, ``graph_us`` on the GPU). Raises ``CheckFailed`` when a check fails (nothing is
    timed then); any other exception (FLA error, OOM) propagates to ``run_sweep``, which stores
    the point as failed and goes on (an OOM first drops the cached inputs)."""
    prov = point["provider"]
    if prov not in PROVIDERS:
        raise ValueError(f"provider: unknown {prov!r}; known {list(PROVIDERS)}")
    try:
        c = _case(point)
        if prov == "decodes":
            return _point_decodes(c)
        if prov == "chain_snapshots":
            return _point_chain(c)
        if prov == "fla_fused_recurrent":
            return _point_fla(c)
        form, mode = prov.split("_")[1:]
        return _point_carry(c, form, mode == "lazy")
    except torch.OutOfMemoryError:
        release()
        raise


# ---- tables ------------------------------------------------------------------------------------

def on_gpu(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds GPU (``do_bench``) timings."""
    return "timer" in df and (df["timer"] == "do_bench").any()


def roofline_gbps(df: pd.DataFrame) -> float | None:
    """The copy bandwidth the rows were divided by (GB/s), None without GPU rows."""
    if "copy_gbps" not in df:
        return None
    vals = pd.to_numeric(df["copy_gbps"], errors="coerce").dropna()
    return float(vals.iloc[0]) if len(vals) else None


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel and compared quantity: points, passed, worst rel_l2 and its tolerance (error
    rows), or the bitwise / protocol flags."""
    if df.empty or "passed" not in df:
        return pd.DataFrame()
    chk = df[df["passed"].notna()].copy()
    chk["what"] = chk["what"].fillna("")
    chk["passed"] = chk["passed"].astype(bool)
    err = chk[chk["metric"] == "rel_l2"]
    t1 = (err.groupby(["kernel", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum"), worst_rel_l2=("value", "max"),
               tolerance=("tolerance", "max")).reset_index())
    vs_dec = t1["what"].str.contains("vs decode|written-back", regex=True)
    t1["check"] = np.where(vs_dec, "rel. L2 vs decode", "rel. L2 vs float64 reference")
    flg = chk[~chk["metric"].isin(["rel_l2", "max_abs"])]
    t2 = (flg.groupby(["kernel", "metric", "what"])
          .agg(points=("value", "size"), passed=("passed", "sum")).reset_index()
          .rename(columns={"metric": "check"}))
    out = pd.concat([t1, t2], ignore_index=True)
    out["passed"] = out["passed"].astype(int)
    cols = ["kernel", "check", "what", "points", "passed", "worst_rel_l2", "tolerance"]
    out = out[[c for c in cols if c in out]]
    return out.sort_values(["kernel", "check", "what"]).reset_index(drop=True)


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    """One line per failed point: its parameters and error text."""
    return _failed_points(df, ("provider", "K", "B", "HK", "HV", "head_dim", "dtype", "gate", "M", "T"))


def wide_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per timed (point, kernel) that passed its checks: the point's parameters and
    ``time_us`` (+ ``p20``, ``p80``, ``graph_us``, ``floor_us``), ``gbps``, ``bytes`` and, on a
    GPU, ``roofline_frac``. Interpreter and GPU timings are never mixed (``speed_rows``)."""
    if df.empty or "metric" not in df:
        return pd.DataFrame()
    tm = speed_rows(df, "time_us")
    if tm.empty:
        return pd.DataFrame()
    key = ["point_id", "kernel"]
    out = tm.rename(columns={"value": "time_us"}).drop(columns=["metric", "bytes"], errors="ignore")
    for metric in ("gbps", "roofline_frac"):
        m = speed_rows(df, metric)
        if m.empty:
            continue
        cols = ["value"] + (["bytes"] if metric == "gbps" else [])
        m = m[key + cols].rename(columns={"value": metric})
        out = out.merge(m, on=key, how="left")
    return out.reset_index(drop=True)


def main_shape(df: pd.DataFrame) -> dict:
    """``MAIN_SHAPE`` if the results hold it, else the shape with the most timed points."""
    w = wide_table(df)
    if w.empty:
        return {}
    sizes = w.groupby(list(SHAPE_KEYS)).size()
    if tuple(MAIN_SHAPE[k] for k in SHAPE_KEYS) in sizes.index:
        return dict(MAIN_SHAPE)
    return dict(zip(SHAPE_KEYS, sizes.idxmax()))


def _sel_shape(df: pd.DataFrame, shape: dict) -> pd.DataFrame:
    for k, v in shape.items():
        df = df[df[k] == v]
    return df


def _lookup(w: pd.DataFrame, kernel: str, col: str, **where) -> float:
    """``w[col]`` of the one row of ``kernel`` matching ``where`` (NaN if none)."""
    if w.empty or col not in w:
        return math.nan
    s = w[w["kernel"] == kernel]
    for k, v in where.items():
        s = s[s[k] == v]
    return float(s[col].iloc[0]) if len(s) and pd.notna(s[col].iloc[0]) else math.nan


def lazy_table(df: pd.DataFrame, shape: dict | None = None, Bs=(1, 64, 128)) -> pd.DataFrame:
    """Time per verify (us) of the carry forms per ``K`` and ``B``: eager, the lazy timings
    without and with a write-back, and their amortised combination with the write-back
    frequency it used."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    w = w[w["B"].isin(Bs) & w["kernel"].str.startswith("carry_")
          & ~w["kernel"].str.endswith(PLAN_SUFFIX)]
    if w.empty:
        return pd.DataFrame()
    w = w.assign(form=w["kernel"].str.split("_").str[1])
    out = w.pivot_table(index=["form", "K", "B"], columns="variant", values="time_us").reset_index()
    out.columns.name = None
    amort = w[w["variant"] == "amortised"].set_index(["form", "K", "B"])["wb_frac"]
    out["write-back freq used"] = [amort.get(k, math.nan)
                                   for k in zip(out["form"], out["K"], out["B"])]
    return out.round(3)


def b1_table(df: pd.DataFrame, shape: dict | None = None) -> pd.DataFrame:
    """``B = 1``: the do_bench time per call (host launch included) and, on a GPU, the CUDA
    graph replay time, per kernel and ``K``."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    w = w[w["B"] == 1]
    cols = ["kernel", "K", "time_us"] + (["graph_us"] if "graph_us" in w else [])
    return w[cols].sort_values(["K", "kernel"]).reset_index(drop=True).round(2)


def shapes_table(df: pd.DataFrame, B: int = 64, K: int = 4) -> pd.DataFrame:
    """Time, GB/s and roofline fraction of every provider: ``K`` (4) for every shape and
    ``K = 8`` at the main shape (the head sizes, head counts and rows issue 5 asks to see), at
    batch width ``B``, or the largest batch width below it that the shape was run at."""
    w = wide_table(df)
    if w.empty:
        return pd.DataFrame()
    w = w[w["kernel"].isin(PROVIDERS)]
    main = main_shape(df)
    is_main = np.ones(len(w), dtype=bool)
    for k, v in main.items():
        is_main &= (w[k] == v).to_numpy()
    w = w[(w["K"] == K).to_numpy() | ((w["K"] == 8).to_numpy() & is_main)]
    if w.empty:
        return pd.DataFrame()
    keys = list(SHAPE_KEYS) + ["K"]
    below = w[w["B"] <= B]
    if below.empty:
        return pd.DataFrame()
    pick = below.groupby(keys)["B"].transform("max")
    w = below[below["B"] == pick]
    cols = [c for c in ("HK", "HV", "head_dim", "dtype", "K", "B", "kernel", "time_us", "gbps",
                        "roofline_frac") if c in w]
    out = w[cols].sort_values(["HV", "head_dim", "K", "kernel"]).reset_index(drop=True)
    return out.round({"time_us": 2, "roofline_frac": 3})


def pmll_table(pdf: pd.DataFrame, min_bytes: float = 4 * L2_BYTES) -> pd.DataFrame:
    """PMLL read and write launches: MB moved, time, GB/s and (GPU) roofline fraction; on a GPU
    only launches moving at least ``min_bytes`` (4x the L2)."""
    w = wide_table(pdf)
    if w.empty:
        return pd.DataFrame()
    w = w.assign(MB=w["bytes"].astype(float) / 1e6)
    if on_gpu(w):
        w = w[w["MB"] * 1e6 >= min_bytes]
    cols = [c for c in ("kernel", "gate", "dtype", "B", "H", "M", "T", "D", "MB", "time_us",
                        "gbps", "roofline_frac") if c in w]
    return w[cols].reset_index(drop=True).round({"MB": 1, "time_us": 2, "roofline_frac": 3})


# ---- targets -----------------------------------------------------------------------------------

def _pct(v: float) -> str:
    return "not measured" if math.isnan(v) else f"{v:.1%}"


def targets_table(df: pd.DataFrame, pdf: pd.DataFrame | None = None, *, mean_accept: float = 3.3,
                  accept_K: int = 4, seed: int = 0) -> pd.DataFrame:
    """Issue 5's targets, each computed from the data: ``target``, ``measured``, ``status``:
    ``met`` / ``missed``, ``not measured`` (no such rows), ``reported`` (no threshold), or
    ``GPU only`` for every target when the results hold no GPU timing (interpreter wall times
    say nothing about the roofline)."""
    rows: list[dict] = []
    w_all = wide_table(df)
    gpu = on_gpu(w_all) if not w_all.empty else False
    w = _sel_shape(w_all, MAIN_SHAPE) if gpu else pd.DataFrame()

    def add(target: str, measured: str | None, ok: bool | None):
        if not gpu:
            rows.append({"target": target, "measured": "GPU only", "status": "GPU only"})
        elif measured is None:
            rows.append({"target": target, "measured": "not measured", "status": "not measured"})
        else:
            rows.append({"target": target, "measured": measured,
                         "status": "reported" if ok is None else ("met" if ok else "missed")})

    def get(kernel, col, K, B):
        return _lookup(w, kernel, col, K=K, B=B)

    f4 = acceptance(4, mean_accept, accept_K, seed=seed)["lazy_wb"]
    for form, label, frac_t, speed_t in (("wy", "WY", 0.75, 3.5), ("exact", "exact", 0.50, 2.5)):
        kern = f"carry_{form}_lazy"
        for B in (64, 128):
            fr = get(kern, "roofline_frac", 4, B)
            add(f"carry lazy {label}, K=4, B={B}: >= {frac_t:.0%} of roofline (write-backs "
                f"amortised at f = {f4:.2f})", None if math.isnan(fr) else _pct(fr),
                None if math.isnan(fr) else fr >= frac_t)
            tf, tc = get("fla_fused_recurrent", "time_us", 4, B), get(kern, "time_us", 4, B)
            sp = tf / tc
            add(f"carry lazy {label}, K=4, B={B}: >= {speed_t}x faster than FLA (same K rows)",
                None if math.isnan(sp) else f"{sp:.2f}x ({tc:.1f} us vs FLA {tf:.1f} us)",
                None if math.isnan(sp) else sp >= speed_t)
    for B in (64, 128):
        fr = get("chain_snapshots", "roofline_frac", 4, B)
        add(f"snapshot chain, K=4, B={B}: >= 75% of its roofline",
            None if math.isnan(fr) else _pct(fr), None if math.isnan(fr) else fr >= 0.75)
    for B in (64, 128, 256):
        fr = get("decodes", "roofline_frac", 1, B)
        add(f"decode (K=1), B={B}: >= 85% of roofline",
            None if math.isnan(fr) else _pct(fr), None if math.isnan(fr) else fr >= 0.85)
        td, tf = get("decodes", "time_us", 1, B), get("fla_fused_recurrent", "time_us", 1, B)
        add(f"decode (K=1), B={B}: faster than FLA",
            None if math.isnan(td + tf) else f"{td:.1f} us vs FLA {tf:.1f} us ({tf / td:.2f}x)",
            None if math.isnan(td + tf) else td < tf)
    for kern in ("carry_wy_lazy", "carry_exact_lazy"):
        tb, gr = get(kern, "time_us", 4, 1), get(kern, "graph_us", 4, 1)
        add(f"B=1, K=4, {LABELS[kern]}: <= 10 us per verify call (do_bench, host launch "
            "included)", None if math.isnan(tb) else
            f"{tb:.1f} us (CUDA graph replay: {'n/a' if math.isnan(gr) else f'{gr:.1f} us'})",
            None if math.isnan(tb) else tb <= 10.0)
    pw = wide_table(pdf) if pdf is not None and gpu else pd.DataFrame()
    for kern, label in (("pmll_read", "PMLL read"), ("pmll_write", "PMLL write")):
        target = f"{label}: >= 80% of copy bandwidth at >= 4x the L2 ({4 * L2_BYTES / 1e6:.0f} MB)"
        s = pw[(pw["kernel"] == kern) & (pw["bytes"] >= 4 * L2_BYTES)] if not pw.empty else pw
        if s.empty or "roofline_frac" not in s:
            add(target, None, None)
            continue
        worst = float(s["roofline_frac"].min())
        add(target, f"worst {worst:.1%}, median {s['roofline_frac'].median():.1%} over "
                    f"{len(s)} launches", worst >= 0.80)
    others = [("head size 64", dict(MAIN_SHAPE, head_dim=64), 4),
              ("head size 256", dict(MAIN_SHAPE, head_dim=256), 4),
              ("HV=64", dict(MAIN_SHAPE, HV=64), 4), ("K=8", MAIN_SHAPE, 8)]
    for label, shp, K in others:
        s = _sel_shape(w_all, shp) if gpu else pd.DataFrame()
        if not s.empty:
            s = s[(s["K"] == K) & (s["B"] == 64) & s["kernel"].isin(PROVIDERS)]
        txt = ", ".join(f"{LABELS[k]} {_pct(v)}" for k, v in zip(s.get("kernel", []),
                                                                  s.get("roofline_frac", [])))
        add(f"{label}: roofline fractions reported (K={K}, B=64)", txt or None, None)
    return pd.DataFrame(rows)


# ---- plots -------------------------------------------------------------------------------------

def plot_roofline(df: pd.DataFrame, shape: dict | None = None):
    """One column per ``K``: time per verify against batch width ``B``, every provider a line,
    with (GPU) the roofline-floor time dashed (state read once, ``K`` stash rows and rows in and
    out) and the state-read-and-written-once time dotted; on a GPU a second row holds each
    provider's fraction of the roofline. On the CPU the single row is the Triton interpreter's
    wall time, labelled so (no roofline there). Returns the figure (None without timings)."""
    import matplotlib.pyplot as plt

    w = wide_table(df)
    if w.empty:
        return None
    shape = main_shape(df) if shape is None else shape
    w = _sel_shape(w, shape)
    gpu = on_gpu(w)
    roof = roofline_gbps(df) if gpu else None
    Ks = sorted(w["K"].unique())
    nrow = 2 if gpu else 1
    fig, axes = plt.subplots(nrow, len(Ks), figsize=(3.4 * len(Ks), 3.2 * nrow), squeeze=False)
    dt = getattr(torch, shape["dtype"])
    for j, K in enumerate(Ks):
        ax = axes[0][j]
        for prov in PROVIDERS:
            s = w[(w["K"] == K) & (w["kernel"] == prov)].sort_values("B")
            if s.empty:
                continue
            col, ls, mk = STYLE[prov]
            ax.plot(s["B"], s["time_us"], ls=ls, marker=mk, ms=3, color=col, label=LABELS[prov])
            if gpu and "roofline_frac" in s:
                axes[1][j].plot(s["B"], s["roofline_frac"], ls=ls, marker=mk, ms=3, color=col,
                                label=LABELS[prov])
        if roof:
            Bs = np.array(sorted(w[w["K"] == K]["B"].unique()))
            args = (int(K), shape["HK"], shape["HV"], shape["head_dim"], dt)
            ax.plot(Bs, [floor_bytes(int(b), *args) / (roof * 1e3) for b in Bs], "k--", lw=1,
                    label="roofline floor (state read once)")
            ax.plot(Bs, [nosnap_bytes(int(b), *args) / (roof * 1e3) for b in Bs], ":",
                    color="grey", lw=1, label="state read + written once")
            bx = axes[1][j]
            bx.axhline(1.0, color="k", lw=0.8)
            bx.axhline(0.75, color="grey", ls="--", lw=0.8)
            bx.set_ylim(0, 1.1)
            bx.set_xscale("log", base=2)
            bx.set_xlabel("batch width B (sequences)")
        else:
            ax.set_xlabel("batch width B (sequences)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"K = {K}")
    axes[0][0].set_ylabel("time per verify (us, do_bench median)" if gpu else
                          "time per verify (us)\nTriton interpreter wall time, not GPU speed")
    if gpu:
        axes[1][0].set_ylabel("fraction of copy roofline\n(SPEC §4 bytes; -- 75 %)")
    axes[0][-1].legend(fontsize=6, loc="best")
    desc = ", ".join(f"{k}={v}" for k, v in shape.items())
    fig.suptitle(("Verify time and roofline fraction" if gpu else
                  "Verify time (Triton interpreter wall time, not GPU speed)")
                 + f" vs batch width ({desc}" + (f"; copy roofline {roof:.0f} GB/s)" if roof else ")"),
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_errors(df: pd.DataFrame, ax=None):
    """rel_l2 of every kernel against the float64 reference (and decode), each tolerance as a
    short dash; 0 drawn at 1e-12. Returns the axes (None without error rows)."""
    import matplotlib.pyplot as plt

    err = df[df["metric"] == "rel_l2"].copy() if "metric" in df else pd.DataFrame()
    if err.empty:
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 4.2), layout="constrained")
    err["cat"] = err["kernel"] + ": " + err["what"].fillna("")
    cats = sorted(err["cat"].unique())
    for i, cat in enumerate(cats):
        s = err[err["cat"] == cat]
        col = STYLE.get(s["kernel"].iloc[0], ("C7",))[0]
        ax.scatter([i] * len(s), s["value"].astype(float).clip(lower=1e-12), s=10, color=col,
                   alpha=0.6)
        ax.hlines(float(s["tolerance"].max()), i - 0.35, i + 0.35, colors="k", linestyles="--",
                  lw=1)
    ax.set_xticks(range(len(cats)), cats, fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_ylabel("rel. L2 error")
    ax.set_title("Errors checked before timing (-- tolerance; 0 drawn at 1e-12)", fontsize=10)
    return ax


# ---- conclusion --------------------------------------------------------------------------------

def conclusion(df: pd.DataFrame, pdf: pd.DataFrame | None, targets: pd.DataFrame, *,
               mean_accept: float = 3.3, accept_K: int = 4, seed: int = 0) -> str:
    """A few sentences written from the results (markdown)."""
    lines = []
    n_pts = df["point_id"].nunique() if "point_id" in df else 0
    n_fail = df[df["status"] == "failed"]["point_id"].nunique() if n_pts else 0
    lines.append(f"- GDN: {n_pts} provider points run, {n_fail} failed (a check or an error)"
                 + (": see the failed points above." if n_fail else "."))
    if pdf is not None and not pdf.empty:
        pf = pdf[pdf["status"] == "failed"]["point_id"].nunique()
        lines.append(f"- PMLL: {pdf['point_id'].nunique()} ring points, {pf} failed.")
    a4 = acceptance(4, mean_accept, accept_K, seed=seed)
    lines.append(f"- Acceptance process: alpha = {a4['alpha']:.3f} per draft (mean accepted "
                 f"length {mean_accept} at K={accept_K}); the lazy verify writes back in "
                 f"{a4['lazy_wb']:.0%} of K=4 verifies (mean {a4['lazy_mean_pend']:.2f} pending "
                 "rows): the frequency the amortised lazy figures use.")
    w = wide_table(df)
    if w.empty or not on_gpu(w):
        lines.append("- No GPU timing in these results: the times are Triton-interpreter wall "
                     "times on the CPU, there is no roofline, and every target reads 'GPU only'. "
                     "Run the full preset on the H200 for the figures.")
        return "\n".join(lines)
    roof = roofline_gbps(df)
    if roof:
        lines.append(f"- Copy roofline of this run: {roof:.0f} GB/s.")
    m = _sel_shape(w, MAIN_SHAPE)
    for B in (64, 128):
        parts = []
        for prov in PROVIDERS:
            tm = _lookup(m, prov, "time_us", K=4, B=B)
            fr = _lookup(m, prov, "roofline_frac", K=4, B=B)
            if not math.isnan(tm):
                parts.append(f"{LABELS[prov]} {tm:.1f} us ({_pct(fr)})")
        if parts:
            lines.append(f"- K=4, B={B} (HV=32, kd=vd=128): " + "; ".join(parts) + ".")
    if not targets.empty:
        counts = targets["status"].value_counts()
        lines.append("- Targets: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + ".")
        for _, r in targets[targets["status"] == "missed"].iterrows():
            lines.append(f"  - missed: {r['target']}: measured {r['measured']}.")
    return "\n".join(lines)
