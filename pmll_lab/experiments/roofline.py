"""The roofline notebook: every verify kernel and peer against the copy roofline, in one run.

A point ``(K, B, HK, HV, head_dim, dtype, state_layout, state_dtype, provider)`` verifies the
same ``K`` draft rows of ``B`` sequences from the same state; the lazy carry is timed without
(``:nowb``) and with (``:wb``) a write-back and amortised at the acceptance process's
write-back frequency; launch plans (``<kernel>:plan``) at ``B <= PLAN_MAX_B``. Providers:
``roofline_case``; checks: ``roofline_providers``; tables: ``roofline_report``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from pmll_lab.backend import DEVICE
from pmll_lab.experiments import protocol as P
from pmll_lab.ops.gdn.checks import MAX_ROWS
from pmll_lab.experiments import replayssm_peer
from pmll_lab.experiments import roofline_providers  # noqa: F401  (binds the point functions)
from pmll_lab.experiments import roofline_case as C
from pmll_lab.experiments.acceptance import (  # noqa: F401  (for the notebook and tests)
    acceptance, acceptance_table, alpha_for_mean, draw_pending, mean_accept_len,
)
from pmll_lab.experiments.roofline_case import (  # noqa: F401
    CAP, CUDA_TWINS, FLASHINFER, GRAPH_REPLAYS, HALF_STATE_PROVIDERS, LAYOUTS, MAIN_SHAPE,
    NATIVE_LAYOUT, OURS, PEERS, PROVIDERS, REPLAYSSM, SHAPE_KEYS, STATE_DTYPES, layout_support,
    release,
)
from pmll_lab.experiments.roofline_report import *  # noqa: F401,F403  (tables, targets, plots)
from pmll_lab.harness import registry
from pmll_lab.harness import verify as V
from pmll_lab.ops.gdn.decode_cuda import MAX_KD as CUDA_MAX_KD
from pmll_lab.peers import fla_available, flashinfer_available, flashinfer_supports
from pmll_lab.sizes import (  # noqa: F401  (for the tests)
    carry_bytes, fla_bytes, floor_bytes, stash_row_bytes,
)
from pmll_lab.sweep import CheckFailed


def impl_of(name: str) -> str:
    """The ``impl`` column of a provider's rows (a ``:variant`` suffix ignored), from its
    registration: ``cuda`` for a CUDA C++ twin, the peer's ``provider`` for a peer (``fla``,
    ``flashinfer``), else ``triton`` (ours). An unregistered name (an older run's) by its
    spelling: ``*_cuda``, ``fla_*``, ``flashinfer*``."""
    base = name.split(":")[0]
    impl = registry.IMPLEMENTATIONS.get(base)
    if impl is not None:
        return "cuda" if impl.impl == "cuda" else (
            impl.provider if impl.provider != "pmll_lab" else "triton")
    if base.endswith("_cuda"):
        return "cuda"
    if base.startswith("fla_"):
        return "fla"
    return "flashinfer" if base.startswith("flashinfer") else "triton"


COMPILE_KEYS = ("provider", "K", "head_dim", "dtype", "state_layout", "state_dtype")
"""Point keys that decide which kernels a point compiles (``run_sweep(affinity=...)``)."""


def _wanted(prov: str, base: dict, fla: bool, flashinfer: bool, sdt: str) -> bool:
    """Whether ``prov`` runs at this ``(K, shape)`` and state dtype, from its registration
    (``harness.verify``): a state dtype it takes; a peer where available (``fla``,
    ``flashinfer``); a ``gdn_decode`` implementation (FlashInfer's decode) at ``K = 1`` only; a
    CUDA C++ twin on a GPU at ``kd <= 256``; FlashInfer's head sizes and dtypes
    (``flashinfer_supports``); then the ``supports`` of one registered in ``roofline_verify`` (the
    chain and FlashInfer's mtp need ``K > 1``). FlashInfer's ReplaySSM runs at every shape where
    FlashInfer does: its point writes ``unsupported`` rows itself."""
    K, D, dt = base["K"], base["head_dim"], base["dtype"]
    impl = registry.get(prov)
    if sdt != "float32" and prov not in HALF_STATE_PROVIDERS:
        return False
    if impl.provider == "fla":
        return fla
    if impl.provider == "flashinfer" and not flashinfer:
        return False
    if impl.family == "gdn_decode" and K != 1:
        return False           # a decode verifies one row
    if impl.impl == "cuda" and not (DEVICE.type == "cuda" and D <= CUDA_MAX_KD):
        return False           # a CUDA C++ twin: a GPU, kd <= 256
    if prov in REPLAYSSM:      # shapes it does not take: its point's "unsupported" rows
        return True
    if prov in FLASHINFER and not (flashinfer_supports(D, dt) and (
            sdt == "float32" or flashinfer_supports(D, dt, sdt))):
        return False           # FlashInfer's head sizes and dtypes
    if impl.family != V.FAMILY or impl.supports is None:
        return True            # a joined implementation's supports takes its own family's case
    try:
        return impl.supports(SimpleNamespace(rows=K, head_dim=D, dtype=dt, state_dtype=sdt)) is None
    except Exception:  # noqa: BLE001 - its supports at fault: the point runs, and is checked
        return True


def _point(p: dict, fla: bool, flashinfer: bool) -> dict | None:
    """A grid point as the provider runs it (a peer in its own layout; ``state_dtype`` only
    off fp32, so fp32 points keep their ids), or None where it does not run."""
    (hk, hv), prov, sdt = p["heads"], p["provider"], p["state_dtype"]
    base = dict(K=int(p["K"]), B=int(p["B"]), HK=int(hk), HV=int(hv),
                head_dim=int(p["head_dim"]), dtype=str(p["dtype"]))
    if not _wanted(prov, base, fla, flashinfer, sdt):
        return None
    q = dict(base, state_layout=NATIVE_LAYOUT.get(prov, p["state_layout"]), provider=prov)
    return q if sdt == "float32" else dict(q, state_dtype=sdt)


AXES = ("B", "K", "dtype", "head_dim", "heads", "providers", "state_dtype", "state_layout",
        "seed")
"""The roofline GDN sweep's axes as a grid writes them (``protocol.check_axes``; a point
carries one ``provider``)."""


def points(grids: list[dict], *, seed: int = 0, mean_accept: float = 3.3, accept_K: int = 4,
           fla: bool | None = None, flashinfer: bool | None = None) -> list[dict]:
    """Grids (axes ``K, B, head_dim, heads`` as ``(HK, HV)``, ``dtype``; optional
    ``state_layout``, ``state_dtype``, ``providers``) -> one point per provider, layout and
    state dtype its launchers take; peers only where available (``fla``, ``flashinfer``) and
    supported. Each carries ``slots``/``rows_max`` (one input draw per shape). ``ValueError``
    for an unknown provider, layout or state dtype."""
    fla = fla_available() if fla is None else fla
    flashinfer = flashinfer_available() if flashinfer is None else flashinfer
    grids = list(grids)
    P.check_axes(grids, AXES)
    full = []
    for g in grids:
        many = [k for k in P.axis_values(g, "K", []) if isinstance(k, int) and k > MAX_ROWS]
        if many:
            raise ValueError(f"grids: axis K: at most {MAX_ROWS} rows per verify (the kernels' "
                             f"bound), got {many[0]}")
        ax = dict(heads=[tuple(h) for h in P.pair_axis(g, "heads")],
                  state_dtype=[str(x) for x in P.axis_values(g, "state_dtype", ["float32"])],
                  provider=list(P.axis_values(g, "providers", PROVIDERS)),
                  state_layout=[str(x) for x in P.axis_values(g, "state_layout", ["kv"])])
        for name, vals, known in (("state_dtype", ax["state_dtype"], STATE_DTYPES),
                                  ("providers", ax["provider"], PROVIDERS),
                                  ("state_layout", ax["state_layout"], LAYOUTS)):
            bad = [x for x in vals if x not in known]
            if bad:
                raise ValueError(f"{name}: unknown {bad}; known {list(known)}")
        rest = {k: v for k, v in g.items() if k not in (*ax, "providers")}
        full.append({**rest, **ax})
    pts = P.grid_points(full, each=lambda p: _point(p, fla, flashinfer),
                        axes=(*AXES, "provider"), choices={"dtype": P.KERNEL_DTYPES})

    def shape_of(p):
        return tuple(p[k] for k in SHAPE_KEYS)

    slots, rows = {}, {}
    for p in pts:
        slots[shape_of(p)] = max(slots.get(shape_of(p), 0), p["B"])
        rows[shape_of(p)] = max(rows.get(shape_of(p), 0), p["K"])
    order = {s: i for i, s in enumerate(dict.fromkeys(shape_of(p) for p in pts))}
    pts.sort(key=lambda p: (order[shape_of(p)], p["K"], p["B"], LAYOUTS.index(p["state_layout"]),
                            STATE_DTYPES.index(p.get("state_dtype", "float32")),
                            PROVIDERS.index(p["provider"])))
    for p in pts:
        p.update(slots=slots[shape_of(p)], rows_max=rows[shape_of(p)], seed=P.int_param("seed", seed),
                 mean_accept=float(mean_accept), accept_K=int(accept_K))
    return pts


def _tag_state(rows: list[dict], state_dtype: str) -> list[dict]:
    """A bf16/fp16-state point's rows: ``state_dtype`` on each, ``[<dtype> state]`` after each
    check's ``what`` (so tables and plots keep them apart)."""
    for r in rows:
        r.setdefault("impl", impl_of(str(r.get("kernel", ""))))
    if state_dtype != "float32":
        for r in rows:
            r["state_dtype"] = state_dtype
            if "what" in r:
                r["what"] = f"{r['what']} [{state_dtype} state]".strip()
    return rows


def gdn_point(point: dict) -> list[dict]:
    """Check, then time, one provider at one point (module docstring); ``points`` fills the
    keys. Raises ``CheckFailed`` (carrying the rows) when a check fails, nothing timed then;
    any other exception (a peer's error, out of memory: the cached inputs are dropped first)
    becomes a failed point in ``run_sweep``."""
    prov = point["provider"]
    if prov not in PROVIDERS:
        raise ValueError(f"provider: unknown {prov!r}; known {list(PROVIDERS)}")
    layout = point.get("state_layout", "kv")
    if not layout_support(prov, layout):
        raise ValueError(f"state_layout: {prov} does not run with {layout!r} states")
    sdt = point.get("state_dtype", "float32")
    if sdt != "float32" and prov not in HALF_STATE_PROVIDERS:
        raise ValueError(f"state_dtype: {prov} runs fp32 states only, got {sdt!r}")
    if prov in REPLAYSSM:
        return _tag_state(replayssm_peer.replayssm_rows(point, timing=C.TIMING), sdt)
    if prov in CUDA_TWINS and (DEVICE.type != "cuda" or int(point["head_dim"]) > CUDA_MAX_KD):
        why = ("needs an NVIDIA GPU (a CUDA C++ twin)" if DEVICE.type != "cuda"
               else f"the twin takes kd <= {CUDA_MAX_KD}")
        status = "unavailable" if DEVICE.type != "cuda" else "unsupported"
        return [{"kernel": prov, "metric": status, "value": 1.0, "status": status,
                 "reason": why, "state_dtype": sdt, "impl": "cuda"}]
    try:
        c = C.case(point)
        try:
            rows = V.point(prov)(c)
        except CheckFailed as exc:
            _tag_state(exc.rows, sdt)
            raise
        return _tag_state(rows, sdt)
    except torch.OutOfMemoryError:
        release()
        raise
