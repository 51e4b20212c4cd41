"""The roofline notebook (issue 5): every verify kernel and peer against the copy roofline, in one run.

What one run measures (SPEC §4; issue 5's targets):

- the **roofline**: the device copy bandwidth (``pmll_lab.bench.copy_bandwidth``);
- for each point ``(K, B, HK, HV, head_dim, dtype, state_layout, provider)`` a **provider**
  verifying the same ``K`` draft rows of ``B`` sequences from the same state, held K-major
  (``state_layout="kv"``: ``[S, HV, kd, vd]``) or V-major (``"vk"``: ``[S, HV, vd, kd]``):

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
                           keeps no snapshots, so it cannot roll back); K-major only;
  ``flashinfer_decode``    FlashInfer's ``gated_delta_rule_decode_pretranspose`` (``K = 1``,
                           the state updated; ``2*Hb``);
  ``flashinfer_mtp_snapshots``  ``gated_delta_rule_mtp`` with ``intermediate_states_buffer`` and
                           ``disable_state_update=True``: the snapshot verify SGLang runs
                           (``K >= 2``; ``K`` states written, ``(K+1)*Hb``);
  ``flashinfer_mtp_frozen``  the same without the buffer: the state read, nothing written
                           (``Hb``). FlashInfer runs V-major only, on a GPU where
                           flashinfer-python imports, at ``kd >= 128`` with bf16/fp16 inputs
                           (``pmll_lab.peers``); its points are made at ``state_layout="vk"``
                           whatever the grid's layouts. Our providers run at every layout of the
                           grid their launchers take (``layout_support``).

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

**Timers.** On a GPU every timed launch (ours and the peers') gets two ``time_us`` rows (and
``gbps`` / ``roofline_frac`` rows for each): ``timer="do_bench"`` (each call as Python issues it,
host launch included) and ``timer="cuda_graph"`` (``pmll_lab.bench.time_cuda_graph``: the call
captured once, the median of >= 100 individually timed replays: GPU time). Launch plans
(``<kernel>:plan``, ``B <= PLAN_MAX_B``) are timed with do_bench only: their point is the host
path. On the CPU the one timer is the interpreter's wall time. Tables, plots and targets use
cuda_graph where present (``pmll_lab.experiments.roofline_report``).

**State dtype.** A grid may list ``state_dtype`` (default ``["float32"]``): with
``"bfloat16"`` (or ``"float16"``) the state pool, snapshots and written-back states are in that
dtype (half the state bytes; SGLang's ``--mamba-ssm-dtype bfloat16``), our exact providers round
the state where successive decodes store it, the float64 references round at the same points
(``state_dtype=``) and the tolerances widen to a few ulp of the state dtype (``HALF_STATE_TOL``);
the bitwise checks against decoding stay. The WY form and FLA run fp32 states only; FlashInfer's
bf16-state kernels (its pretranspose entry point with a bf16 pool, ``K = V = 128``) are the
``flashinfer_*`` providers at such points. Their rows carry ``state_dtype`` and their checks'
``what`` ends in ``[bfloat16 state]``; the fp32-state tables and plots leave them out and
``roofline_report.state_dtype_table`` sets them against the fp32 state.

**Gating.** The gates come from raw inputs ``A_log, a, dt_bias = 0, b`` (``a, b`` bf16;
``pmll_lab.experiments.common.gating_inputs``): our kernels get ``g, beta`` computed from them in
fp32, FlashInfer the raw inputs; FlashInfer's float64 reference recomputes them in float64.

The tables, targets, headline and plots are in ``roofline_report`` and ``roofline_plots``
(also reachable as attributes of this module); the peers' point functions in ``roofline_peers``.
"""

from __future__ import annotations

import inspect
import math
from functools import lru_cache

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import (
    H200_L2_BYTES,
    bitwise_equal, copy_bandwidth, error_rows, throughput_rows, time_cuda_graph, time_launch,
    timings,
)
from pmll_lab.carry import (
    GDN_CARRY_CAP, GdnCarry, gdn_carry_flush, gdn_carry_verify, gdn_carry_verify_plan,
)
from pmll_lab.gdn import (
    carry_stash_bytes, chain_bytes, decodes_bytes, gdn_chain, gdn_chain_ref, gdn_decode,
    gdn_decode_plan, row_io_bytes, state_bytes,
)
from pmll_lab.inputs import gdn_inputs
from pmll_lab.peers import (  # noqa: F401  (used by the notebook and roofline_peers)
    fla_available, fla_fused_recurrent, fla_runner, fla_supports_gva, fla_version,
    flashinfer_available, flashinfer_status, flashinfer_supports, flashinfer_version, fused_gating,
)
from pmll_lab.reference import carry as ref_carry
from pmll_lab.sweep import CheckFailed, grid, speed_rows
from pmll_lab.experiments.carry import accept_counts, alpha_for_mean, mean_accept_len
from pmll_lab.experiments.common import gating_inputs

CAP = GDN_CARRY_CAP
O_TOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
"""rel_l2 tolerance of outputs against the float64 reference, per input dtype (the outputs are
rounded once to that dtype; tests/test_gdn.py, tests/test_carry.py)."""
STATE_TOL = 1e-5
"""rel_l2 tolerance of fp32 states, snapshots and stash rows against the float64 reference."""
STATE_DTYPES = ("float32", "bfloat16", "float16")
HALF_STATE_TOL = {"bfloat16": 8e-3, "float16": 1e-3}
"""rel_l2 tolerance of a bf16/fp16 state's states, snapshots and outputs against the float64
reference with the same rounding points: an fp32 value and its float64 twin can round to
neighbouring values of the state dtype (one ulp: 2**-8 for bf16), and the flip is carried on by
the later rows (tests/test_state_dtype.py sees ~1e-3 for bf16 after a few verifies)."""
HALF_STATE_PROVIDERS = ("decodes", "chain_snapshots", "carry_exact_eager", "carry_exact_lazy",
                        "flashinfer_decode", "flashinfer_mtp_snapshots", "flashinfer_mtp_frozen")
"""Providers that run a bf16/fp16 state (the WY form refuses one; FLA is run on fp32 only)."""
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

GRAPH_REPLAYS = 200
"""Replays ``time_cuda_graph`` times per launch (its minimum is 100)."""

OURS = ("decodes", "chain_snapshots", "carry_exact_eager", "carry_exact_lazy",
        "carry_wy_eager", "carry_wy_lazy")
FLASHINFER = ("flashinfer_decode", "flashinfer_mtp_snapshots", "flashinfer_mtp_frozen")
PEERS = ("fla_fused_recurrent",) + FLASHINFER
PROVIDERS = OURS + PEERS
LAYOUTS = ("kv", "vk")
"""State layouts: ``"kv"`` K-major ``[S, HV, kd, vd]``, ``"vk"`` V-major ``[S, HV, vd, kd]``."""
NATIVE_LAYOUT = {"fla_fused_recurrent": "kv", **{p: "vk" for p in FLASHINFER}}
"""The one layout each peer runs in (its own state layout)."""
LABELS = {
    "decodes": "K x decode (ours)", "chain_snapshots": "chain + snapshots (ours)",
    "carry_exact_eager": "carry exact, eager", "carry_exact_lazy": "carry exact, lazy (amortised)",
    "carry_wy_eager": "carry WY, eager", "carry_wy_lazy": "carry WY, lazy (amortised)",
    "fla_fused_recurrent": "FLA fused_recurrent",
    "flashinfer_decode": "FlashInfer decode",
    "flashinfer_mtp_snapshots": "FlashInfer mtp + snapshots",
    "flashinfer_mtp_frozen": "FlashInfer mtp, frozen (no buffer)",
}
STYLE = {"decodes": ("C4", "-", "v"), "chain_snapshots": ("C2", "-", "s"),
         "carry_exact_eager": ("C0", "--", "o"), "carry_exact_lazy": ("C0", "-", "o"),
         "carry_wy_eager": ("C1", "--", "D"), "carry_wy_lazy": ("C1", "-", "D"),
         "fla_fused_recurrent": ("C3", ":", "x"), "flashinfer_decode": ("C5", ":", "^"),
         "flashinfer_mtp_snapshots": ("C6", ":", "P"), "flashinfer_mtp_frozen": ("C8", ":", "*")}
MAIN_SHAPE = dict(HK=16, HV=32, head_dim=128, dtype="bfloat16")
"""Issue 5's target shape (Qwen3-Next's GDN heads)."""
SHAPE_KEYS = ("HK", "HV", "head_dim", "dtype")
COMPILE_KEYS = ("provider", "K", "head_dim", "dtype", "state_layout", "state_dtype")
"""Point keys that decide which kernels a point compiles: ``run_sweep(affinity=...)`` keeps
points that share them on one Dask worker, so each kernel compiles once per sweep."""


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


def carry_bytes(pend, write_back, K: int, HK: int, HV: int, D: int, dtype,
                state_dtype=torch.float32) -> int:
    """SPEC §4 bytes of one carry verify launch (module docstring): per sequence ``Hb`` read,
    ``Hb`` written if it writes back, ``p`` stash rows read, ``K`` written, ``K`` rows of
    inputs/outputs and three int32 (slot, pend, engaged). ``Hb`` in ``state_dtype``."""
    pend, wb = np.asarray(pend), np.asarray(write_back)
    B = len(pend)
    hb, row = state_bytes(HV, D, D, state_dtype), stash_row_bytes(HV, D, D)
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


def frozen_bytes(B: int, K: int, HK: int, HV: int, D: int, dtype,
                 state_dtype=torch.float32) -> int:
    """A verify that reads the state and writes nothing back (FlashInfer's frozen ``mtp``):
    per sequence ``Hb`` (in ``state_dtype``) + ``K`` rows of inputs/outputs + the slot index."""
    return B * (state_bytes(HV, D, D, state_dtype) + K * row_io_bytes(HK, HV, D, D, dtype) + 4)


# ---- layouts -----------------------------------------------------------------------------------

_LAUNCHERS = {
    "decodes": ("gdn_decode", "gdn_decode_plan"),
    "chain_snapshots": ("gdn_chain", "gdn_decode"),
    "carry": ("gdn_carry_verify", "gdn_carry_verify_plan", "gdn_carry_flush", "gdn_decode"),
}


def _takes_layout(fn) -> bool:
    try:
        return "state_layout" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def layout_support(provider: str, layout: str) -> bool:
    """Whether ``provider`` runs with states in ``layout``: a peer in its native layout only
    (``NATIVE_LAYOUT``); ours in ``"kv"`` always and in ``"vk"`` where every launcher it calls
    takes the ``state_layout`` keyword (read from their signatures)."""
    if layout not in LAYOUTS:
        raise ValueError(f"state_layout: must be one of {LAYOUTS}, got {layout!r}")
    if provider in NATIVE_LAYOUT:
        return NATIVE_LAYOUT[provider] == layout
    if layout == "kv":
        return True
    names = _LAUNCHERS["carry" if provider.startswith("carry_") else provider]
    return all(_takes_layout(globals()[n]) for n in names)


# ---- points ------------------------------------------------------------------------------------

def _wanted(prov: str, base: dict, fla: bool, flashinfer: bool,
            state_dtype: str = "float32") -> bool:
    """Whether ``prov`` runs at this ``(K, shape)`` and state dtype (``points``)."""
    K = base["K"]
    if state_dtype != "float32":
        if prov not in HALF_STATE_PROVIDERS:
            return False
        if prov in FLASHINFER and not (flashinfer and flashinfer_supports(
                base["head_dim"], base["dtype"], state_dtype)):
            return False
    if prov == "chain_snapshots" or prov.startswith("flashinfer_mtp"):
        if K == 1:
            return False           # the chain at K = 1 is one decode; FlashInfer's mtp takes T > 1
    if prov == "flashinfer_decode" and K != 1:
        return False
    if prov == "fla_fused_recurrent":
        return fla
    if prov in FLASHINFER:
        return flashinfer and flashinfer_supports(base["head_dim"], base["dtype"])
    return True


def points(grids: list[dict], *, seed: int = 0, mean_accept: float = 3.3, accept_K: int = 4,
           fla: bool | None = None, flashinfer: bool | None = None) -> list[dict]:
    """Expand grids into points, one per provider and state layout.

    Each grid: axes ``K, B, head_dim, heads`` (list of ``(HK, HV)``), ``dtype``, optionally
    ``state_layout`` (default ``["kv"]``) and ``providers`` (default all of ``PROVIDERS``).
    Dropped: ``chain_snapshots`` and the FlashInfer ``mtp`` providers at ``K = 1``,
    ``flashinfer_decode`` at ``K > 1``; ``fla_fused_recurrent`` unless ``fla`` (default
    ``fla_available()``); the FlashInfer providers unless ``flashinfer`` (default
    ``flashinfer_available()``) and ``flashinfer_supports(head_dim, dtype)``. A peer is made
    at its own layout (``NATIVE_LAYOUT``) whatever the grid's; ours at each of the grid's
    layouts they take (``layout_support``; layouts they do not take are left out).
    Every point also carries ``slots`` and ``rows_max``: the largest ``B`` and ``K`` of its shape
    over all grids (one input draw per shape), ``seed``, ``mean_accept``, ``accept_K``.
    Points are ordered shape, ``K``, ``B``, layout, provider, so that the providers of one
    ``(K, B, layout)`` run one after another and share its inputs and references. Duplicates
    dropped. Raises ``ValueError`` for an unknown provider or layout.
    """
    fla = fla_available() if fla is None else fla
    flashinfer = flashinfer_available() if flashinfer is None else flashinfer
    pts, seen = [], set()
    for g in grids:
        axes = dict(g)
        heads = axes.pop("heads")
        provs = list(axes.pop("providers", PROVIDERS))
        layouts = [str(x) for x in axes.pop("state_layout", ["kv"])]
        sdts = [str(x) for x in axes.pop("state_dtype", ["float32"])]
        bad = [x for x in sdts if x not in STATE_DTYPES]
        if bad:
            raise ValueError(f"state_dtype: unknown {bad}; known {list(STATE_DTYPES)}")
        bad = [p for p in provs if p not in PROVIDERS]
        if bad:
            raise ValueError(f"providers: unknown {bad}; known {list(PROVIDERS)}")
        bad = [x for x in layouts if x not in LAYOUTS]
        if bad:
            raise ValueError(f"state_layout: unknown {bad}; known {list(LAYOUTS)}")
        for p in grid(**axes, heads=[tuple(h) for h in heads]):
            hk, hv = p.pop("heads")
            base = dict(K=int(p["K"]), B=int(p["B"]), HK=int(hk), HV=int(hv),
                        head_dim=int(p["head_dim"]), dtype=str(p["dtype"]))
            for prov, sdt in ((p_, d_) for d_ in sdts for p_ in provs):
                if not _wanted(prov, base, fla, flashinfer, sdt):
                    continue
                lays = [NATIVE_LAYOUT[prov]] if prov in NATIVE_LAYOUT else \
                    [x for x in layouts if layout_support(prov, x)]
                for lay in lays:
                    q = dict(base, state_layout=lay, provider=prov)
                    if sdt != "float32":      # fp32 points keep their ids (resumable runs)
                        q["state_dtype"] = sdt
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
    pts.sort(key=lambda p: (order[shape_of(p)], p["K"], p["B"], LAYOUTS.index(p["state_layout"]),
                            STATE_DTYPES.index(p.get("state_dtype", "float32")),
                            PROVIDERS.index(p["provider"])))
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
                outs.append(gdn_decode(st, *self.row_args[r], state_indices=self.sel,
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
        gdn_carry_flush([st], [carry], self.sel, validate=True, **self.lay)
        folded = st[self.lsel]
        outs = [gdn_decode(st, *self.row_args[r], state_indices=self.sel, **self.lay)
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


def _time(fn, *, graph: bool = True) -> list[dict]:
    """Timings of ``fn``: ``time_launch``'s (do_bench on a GPU, interpreter wall time on the
    CPU) and, on a GPU with ``graph``, ``time_cuda_graph``'s. A capture that fails loses only
    the graph figure: its error text goes to the do_bench timing (``graph_error``)."""
    return timings(fn, graph=graph and _on_cuda(), warmup_ms=WARMUP_MS, rep_ms=REP_MS,
                   cpu_reps=CPU_REPS, replays=GRAPH_REPLAYS, launch_timer=time_launch,
                   graph_timer=time_cuda_graph)


def _mix(t0: list[dict], t1: list[dict], f: float) -> list[dict]:
    """``(1-f)*t0 + f*t1`` per timer found in both (the amortised lazy figure)."""
    other = {t["timer"]: t for t in t1}
    out = []
    for a in t0:
        b = other.get(a["timer"])
        if b is not None:
            m = {k: (1 - f) * float(a[k]) + f * float(b[k]) for k in ("median_us", "p20_us", "p80_us")}
            out.append(dict(m, timer=a["timer"]))
    return out


def _speed_rows(kernel: str, timings: list[dict], nbytes: int, **extra) -> list[dict]:
    """``throughput_rows`` of each timing (one timer each) plus the bytes, the roofline floor
    time (GPU), the graph replay count or capture error, and ``extra`` on every row."""
    roof = copy_bandwidth()
    rows: list[dict] = []
    for timing in timings:
        for r in throughput_rows(kernel, timing, nbytes):
            r.update(extra)
            r["bytes"] = int(nbytes)
            if r["metric"] == "time_us":
                for k in ("replays", "graph_error"):
                    if k in timing:
                        r[k] = timing[k]
                if roof:
                    r["floor_us"] = nbytes / (roof * 1e3)
            rows.append(r)
    return rows


def _point_decodes(c: _Case) -> list[dict]:
    o_dec, st_sel, _ = c.decoded()
    name = "decodes"
    rows = (error_rows(name, o_dec[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st_sel[:c.n], c.to_layout(c.s_ref[:c.n]), tol=c.stol,
                         what="state"))
    plans = None
    if c.B <= PLAN_MAX_B:
        # the same K decodes through launch plans (lean host path): checked bitwise on their
        # second call, the first that skips Triton's launcher on a GPU
        st_p = c.state0.clone()
        plans = [gdn_decode_plan(st_p, *c.row_args[r], state_indices=c.sel, **c.lay)
                 for r in range(c.K)]
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
            gdn_decode(st, *c.row_args[r], state_indices=c.sel, **c.lay)

    nbytes = decodes_bytes(c.B, c.K, **c.io())
    rows += _speed_rows(name, _time(run), nbytes, variant="")
    if plans is not None:
        def run_plans():
            for p in plans:
                p()

        rows += _speed_rows(f"{name}{PLAN_SUFFIX}", _time(run_plans, graph=False), nbytes,
                            variant="launch plan")
    return rows


def _point_chain(c: _Case) -> list[dict]:
    name = "chain_snapshots"
    st = c.state0.clone()
    inter = torch.empty(c.B, c.K - 1, c.HV, c.D, c.D, dtype=c.sdt, device=DEVICE)
    o = gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter, validate=True, **c.lay)
    rows = (error_rows(name, o[:c.n], c.o_ref, tol=c.otol, what="o")
            + error_rows(name, st[c.lsel[:c.n]], c.to_layout(c.s_ref), tol=c.stol,
                         what="state")
            + error_rows(name, inter[:c.n], c.to_layout(c.i_ref), tol=c.stol,
                         what="snapshots"))
    o_dec, st_dec, snaps = c.decoded()
    rows += [_flag(name, "bitwise_vs_decode", bitwise_equal(o, o_dec), "o"),
             _flag(name, "bitwise_vs_decode", bitwise_equal(st[c.lsel], st_dec), "state"),
             _flag(name, "bitwise_vs_decode",
                   all(bitwise_equal(inter[:, t], snaps[t]) for t in range(c.K - 1)), "snapshots")]
    _require(rows)

    def run():
        gdn_chain(st, *c.args, state_indices=c.sel, intermediate=inter, **c.lay)

    return rows + _speed_rows(name, _time(run), chain_bytes(c.B, c.K, **c.io()), variant="")
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
                                  validate=True, eager_max_pending=None, **c.lay)
        wb = cc["wb"]
        want_eng = torch.as_tensor(np.where(wb, 2, 1), dtype=torch.int32)
        rows.append(_flag(name, "engaged_as_protocol", torch.equal(eng.cpu(), want_eng),
                          "engaged" + tag))
        otol = c.otol if form == "exact" else max(c.otol, WY_TOL)
        s = c.lsel[:c.n]
        rows += error_rows(name, o[:c.n], cc["o_ref"], tol=otol, what="o" + tag)
        rows += error_rows(name, st[s], c.to_layout(cc["state_ref"]), tol=c.stol,
                           what="state" + tag)
        rows += error_rows(name, carry.u[s], cc["u_ref"],
                           tol=c.stol if form == "exact" else WY_TOL, what="stash u" + tag)
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
                rows += error_rows(name, st_b[wbm], cc["folded"][wbm], tol=c.stol,
                                        what="written-back state" + tag)
        del st_b
        plan = None
        if c.B <= PLAN_MAX_B:
            # the same verify through a launch plan (lean host path), checked bitwise against
            # the launch above on its second call (the first that skips Triton's launcher)
            st_p, carry_p = c.state0.clone(), clone_carry(cc["carry"])
            plan = gdn_carry_verify_plan(st_p, carry_p, *c.args, slot_tab=c.sel, form=form,
                                         lazy=lazy, **c.lay)
            for _ in range(2):
                st_p.copy_(c.state0)
                carry_p.buf.copy_(cc["carry"].buf)
                o_p, e_p = plan()
            rows.append(_flag(f"{name}{PLAN_SUFFIX}", "bitwise_vs_launcher",
                              bitwise_equal(o_p, o) and bitwise_equal(e_p, eng)
                              and bitwise_equal(st_p, st) and bitwise_equal(carry_p.buf, carry.buf),
                              "o, engaged, state, stash" + tag))
        nbytes = carry_bytes(cc["pend"], wb, c.K, c.HK, c.HV, c.D, c.dtype, c.sdt)
        ready.append((var, st, carry, nbytes, float(np.mean(cc["pend"])), float(np.mean(wb)),
                      plan))
    _require(rows)

    timed = {}
    for var, st, carry, nbytes, mean_pend, wb_frac, plan in ready:
        def run(st=st, carry=carry):
            gdn_carry_verify(st, carry, *c.args, slot_tab=c.sel, form=form, lazy=lazy, **c.lay)

        t = _time(run)
        timed[var] = (t, nbytes)
        kname = name if var == "eager" else f"{name}:{var}"
        rows += _speed_rows(kname, t, nbytes, variant=VARIANT_NAMES[var],
                            mean_pend=mean_pend, wb_frac=wb_frac)
        if plan is not None:
            rows += _speed_rows(f"{kname}{PLAN_SUFFIX}", _time(plan, graph=False), nbytes,
                                variant=f"{VARIANT_NAMES[var]}, launch plan",
                                mean_pend=mean_pend, wb_frac=wb_frac)
    if lazy:
        f = float(c.acc["lazy_wb"])
        (t0, b0), (t1, b1) = timed["nowb"], timed["wb"]
        rows += _speed_rows(name, _mix(t0, t1, f), round((1 - f) * b0 + f * b1),
                            variant="amortised", wb_frac=f,
                            mean_pend=float(c.acc["lazy_mean_pend"]))
    return rows


def gdn_point(point: dict) -> list[dict]:
    """Check, then time, one provider at one ``(shape, K, B, state_layout)`` (module docstring).

    Point keys: ``K, B, HK, HV, head_dim, dtype, state_layout, provider, slots, rows_max, seed,
    mean_accept, accept_K`` (``points`` fills them; ``state_layout`` defaults to ``"kv"``).
    Returns tidy rows: error and flag rows (``passed``), then per timer (``do_bench`` and
    ``cuda_graph`` on a GPU, ``interpreter-wall`` on the CPU) ``time_us`` / ``gbps`` /
    ``roofline_frac`` rows (``bytes``; ``floor_us`` on the GPU). Raises ``CheckFailed`` when a
    check fails (nothing is timed then); any other exception (a peer's error, OOM) propagates
    to ``run_sweep``, which stores the point as failed and goes on (an OOM first drops the
    cached inputs)."""
    from pmll_lab.experiments import roofline_peers

    prov = point["provider"]
    if prov not in PROVIDERS:
        raise ValueError(f"provider: unknown {prov!r}; known {list(PROVIDERS)}")
    layout = point.get("state_layout", "kv")
    if not layout_support(prov, layout):
        raise ValueError(f"state_layout: {prov} does not run with {layout!r} states")
    sdt = point.get("state_dtype", "float32")
    if sdt != "float32" and prov not in HALF_STATE_PROVIDERS:
        raise ValueError(f"state_dtype: {prov} runs fp32 states only, got {sdt!r}")
    try:
        c = _case(point)
        try:
            if prov == "decodes":
                rows = _point_decodes(c)
            elif prov == "chain_snapshots":
                rows = _point_chain(c)
            elif prov == "fla_fused_recurrent":
                rows = roofline_peers.point_fla(c)
            elif prov in FLASHINFER:
                rows = roofline_peers.point_flashinfer(c, prov)
            else:
                form, mode = prov.split("_")[1:]
                rows = _point_carry(c, form, mode == "lazy")
        except CheckFailed as exc:
            _tag_state(exc.rows, sdt)
            raise
        return _tag_state(rows, sdt)
    except torch.OutOfMemoryError:
        release()
        raise


def _tag_state(rows: list[dict], state_dtype: str) -> list[dict]:
    """Rows of a bf16/fp16-state point: ``state_dtype`` on every row and ``[<dtype> state]``
    after each check's ``what`` (so correctness tables and error plots keep them apart)."""
    if state_dtype != "float32":
        for r in rows:
            r["state_dtype"] = state_dtype
            if "what" in r:
                r["what"] = f"{r['what']} [{state_dtype} state]".strip()
    return rows


# ---- tables, headline and plots (roofline_report, roofline_plots) ------------------------------

_REPORT_MODULES = ("roofline_report", "roofline_plots")


def __getattr__(name: str):
    """The tables, targets, headline and plots live in ``roofline_report`` and
    ``roofline_plots`` (which import this module); they are reachable here too
    (``roofline.headline_table``), imported on first use."""
    import importlib

    if name.startswith("__"):
        raise AttributeError(name)
    for mod in _REPORT_MODULES:
        m = importlib.import_module(f"pmll_lab.experiments.{mod}")
        if hasattr(m, name):
            return getattr(m, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
