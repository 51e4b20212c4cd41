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

The acceptance process is in ``pmll_lab.experiments.acceptance``; the shared inputs and
references of one case in ``roofline_case``, our providers' point functions in ``roofline_ours``,
the tables in ``roofline_report``, the targets, headline and conclusion in ``roofline_targets``,
the plots in ``roofline_plots`` (all also reachable as attributes of this module); the peers'
point functions in ``roofline_peers``.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from pmll_lab.backend import DEVICE, INTERPRET
from pmll_lab.bench import (
    H200_L2_BYTES, copy_bandwidth, throughput_rows, time_cuda_graph, time_launch, timings,
)
# our launchers: layout_support reads their signatures; roofline_case and roofline_ours call
# them through this module (so that a test replacing one here replaces it everywhere)
from pmll_lab.carry import (  # noqa: F401
    GDN_CARRY_CAP, gdn_carry_flush, gdn_carry_verify, gdn_carry_verify_plan,
)
from pmll_lab.gdn import (  # noqa: F401
    carry_stash_bytes, gdn_chain, gdn_decode, gdn_decode_plan, row_io_bytes, state_bytes,
)
from pmll_lab.sizes import carry_bytes, stash_row_bytes  # noqa: F401  (the library's, here too)
from pmll_lab.peers import (  # noqa: F401  (used by the notebook and roofline_peers)
    fla_available, fla_fused_recurrent, fla_runner, fla_supports_gva, fla_version,
    flashinfer_available, flashinfer_status, flashinfer_supports, flashinfer_version, fused_gating,
)
from pmll_lab.sweep import CheckFailed, grid
from pmll_lab.experiments import common
from pmll_lab.experiments.acceptance import (  # noqa: F401  (for the notebook and roofline_report)
    accept_counts, acceptance, acceptance_table, alpha_for_mean, draw_pending, mean_accept_len,
)

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
    "carry_wy_eager": "carry WY (reference form), eager",
    "carry_wy_lazy": "carry WY (reference form), lazy (amortised)",
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
COMPILE_KEYS = ("provider",) + common.COMPILE_KEYS + ("state_dtype",)
"""Point keys that decide which kernels a point compiles (``common.COMPILE_KEYS`` plus the
provider and the state dtype): ``run_sweep(affinity=...)`` keeps points that share them on one
Dask worker, so each kernel compiles once per sweep."""


# ---- bytes -------------------------------------------------------------------------------------

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


# ---- cached inputs and references (filled by roofline_case) ------------------------------------

_SHAPE: dict = {}
_CASE: dict = {}


def release() -> None:
    """Drop the cached inputs, decode baselines and carry references (frees device memory)."""
    _SHAPE.clear()
    _CASE.clear()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


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
    from pmll_lab.experiments import roofline_case, roofline_ours, roofline_peers

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
        c = roofline_case._case(point)
        try:
            if prov == "decodes":
                rows = roofline_ours.point_decodes(c)
            elif prov == "chain_snapshots":
                rows = roofline_ours.point_chain(c)
            elif prov == "fla_fused_recurrent":
                rows = roofline_peers.point_fla(c)
            elif prov in FLASHINFER:
                rows = roofline_peers.point_flashinfer(c, prov)
            else:
                form, mode = prov.split("_")[1:]
                rows = roofline_ours.point_carry(c, form, mode == "lazy")
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


# ---- the shared case, our providers, tables, headline and plots (their own modules) ------------

_PARTS = ("roofline_case", "roofline_ours", "roofline_report", "roofline_targets",
          "roofline_plots")


# The shared inputs and references live in ``roofline_case``, our providers' point
# functions in ``roofline_ours``, the tables in ``roofline_report``, the targets, headline and
# conclusion in ``roofline_targets``, the plots in ``roofline_plots`` (all import this module);
# they are reachable here too (``roofline.headline_table``), imported on first use.
__getattr__ = common.parts_getattr(__name__, _PARTS)
