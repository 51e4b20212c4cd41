"""The ``roofline_verify`` family: ``K`` draft rows verified on one state (the roofline notebook).

Its implementations are the roofline's providers: ours (``K`` decodes, the chain with its
snapshots, the exact carried state eager and lazy; the CUDA C++ twins of decode and chain) and
the peers' (FLA's ``fused_recurrent``, FlashInfer's ``mtp`` with snapshots and frozen, and, joined
from their own families by the same names, FlashInfer's decode (``gdn_decode``, the one-row
verify) and its ReplaySSM (``gdn_step``)). Each name is written once, here or in its own family's
registration: the roofline's provider lists, labels, layouts, state dtypes, CUDA twins, peers
and plot colours are read from these registrations (``experiments.roofline_case``).

What each registration says, as the roofline reads it:

- ``layouts``: the state layouts it runs (ours both; a CUDA twin and the peers their own only);
- ``state_dtypes``: the state dtypes it takes (FLA fp32 only);
- ``impl == "cuda"``: a CUDA C++ twin (a GPU, ``kd <= 256``); ``provider != "pmll_lab"``: a peer;
- ``supports(case)``: ``None`` where it runs at the point, else the reason; ``case`` is a
  namespace of the point's ``rows`` (``K``), ``head_dim``, ``dtype`` and ``state_dtype`` (names)
  (FlashInfer's head sizes and dtypes: ``peers.flashinfer_supports``, which the roofline applies
  to every FlashInfer provider; a joined implementation's ``supports`` takes its own family's
  case, which the roofline leaves aside);
- ``style``: its plot colour and error-plot panel.

The roofline checks and times each implementation through its own point function
(``experiments.roofline_providers.point_*``: a ``roofline_case.RooflineCase`` -> rows), not through
``harness.runner.run_point``: this family's ``make_case`` and ``check`` raise ``ValueError``
saying so. ``build(case)`` of an implementation registered here is its bound point function
(``point(name)``), which ``experiments.roofline_providers`` binds (``bind``) when it is imported
(this layer imports no experiment).
"""

from __future__ import annotations

from collections.abc import Callable

from pmll_lab.harness import registry
from pmll_lab.harness.decode import FLASHINFER_DECODE
from pmll_lab.harness.registry import Family, Implementation, add_family, register
from pmll_lab.harness.step_forms import REPLAYSSM, fi_available
from pmll_lab.peers import fla_available, fla_version, flashinfer_version

FAMILY = "roofline_verify"
AXES = ("K", "B", "HK", "HV", "head_dim", "dtype", "state_layout", "state_dtype", "provider",
        "seed", "slots", "rows_max", "mean_accept", "accept_K")
"""The keys of a roofline point (``experiments.roofline.points``)."""
NOT_RUN_POINT = ("roofline_verify: the roofline runs these through its own point functions "
                 "(pmll_lab.experiments.roofline.gdn_point), not harness.runner.run_point")


def _not_run_point(*_args, **_kw):
    raise ValueError(NOT_RUN_POINT)


add_family(Family(
    name=FAMILY, label="K draft rows verified on one state", axes=AXES,
    make_case=_not_run_point, check=_not_run_point,
    doc="the roofline notebook (SPEC §4): every verify kernel and peer against the copy "
        "roofline, checked and timed by experiments.roofline_providers"))

POINTS: dict[str, Callable] = {}
"""The point function of each name (``bind``): ``point(case: roofline_case.RooflineCase) -> rows``."""


def bind(impl: Implementation, fn: Callable) -> None:
    """Make ``fn`` (a ``roofline_case.RooflineCase`` -> rows: check, then time) the roofline point of
    ``impl`` (registered here or joined); ``ValueError`` for one of another family."""
    if impl.name not in registry.names(FAMILY):
        raise ValueError(f"provider: {impl.name!r} is not a {FAMILY} implementation")
    POINTS[impl.name] = fn


def point(name: str) -> Callable:
    """The bound point function of ``name``. ``ValueError`` for a name not of this family;
    ``RuntimeError`` when none is bound (``pmll_lab.experiments.roofline_providers`` binds them
    when imported)."""
    if name not in registry.names(FAMILY):
        raise ValueError(f"provider: unknown {name!r}; known {registry.names(FAMILY)}")
    if name not in POINTS:
        raise RuntimeError(f"{name}: no roofline point bound (import "
                           "pmll_lab.experiments.roofline_providers)")
    return POINTS[name]


def _build(name: str) -> Callable:
    return lambda case: point(name)(case)


def _multi_row(case) -> str | None:
    return "K = 1: a one-row verify is one decode" if int(case.rows) == 1 else None


def _fla_available() -> str | None:
    return None if fla_available() else "FLA: fla-core not importable here (GPU only)"


def _ours(name: str, label: str, color: str, panel: str, *, cuda: bool = False,
          supports: Callable | None = None, doc: str = "") -> Implementation:
    return register(Implementation(
        name=name, family=FAMILY, label=label, build=_build(name), exact=True,
        impl="cuda" if cuda else "triton", gpu_only=cuda,
        layouts=("vk",) if cuda else ("kv", "vk"), supports=supports,
        style={"color": color, "panel": panel}, doc=doc))


DECODES = _ours("decodes", "K x decode", "#9467bd", "decode and chain",
                doc="gdn_decode once per row: the plain decoding every verify answers to")
DECODES_CUDA = _ours("decodes_cuda", "K x decode, CUDA twin", "#ff7f0e", "decode and chain",
                     cuda=True, doc="kernels/gdn_decode.cu once per row")
CHAIN = _ours("chain_snapshots", "chain + snapshots", "#2ca02c", "decode and chain",
              supports=_multi_row, doc="gdn_chain with its K-1 snapshots (SPEC §3a)")
CHAIN_CUDA = _ours("chain_snapshots_cuda", "chain + snapshots, CUDA twin", "#ffbb78",
                   "decode and chain", cuda=True, supports=_multi_row,
                   doc="the chain's CUDA C++ twin")
CARRY_EAGER = _ours("carry_exact_eager", "carry exact, eager", "#aec7e8", "carried state",
                    doc="gdn_carry_verify, exact form, eager (SPEC §3b)")
CARRY_LAZY = _ours("carry_exact_lazy", "carry exact, lazy (amortised)", "#1f77b4",
                   "carried state", doc="gdn_carry_verify, exact form, lazy: timed without "
                   "(:nowb) and with (:wb) a write-back, amortised")
_FLA_NAME = "fla_fused_recurrent"
FLA = register(Implementation(
    name=_FLA_NAME, family=FAMILY, label="FLA fused_recurrent", provider="fla",
    build=_build(_FLA_NAME), layouts=("kv",), state_dtypes=("float32",),
    gpu_only=True, available=_fla_available, version=fla_version,
    style={"color": "#d62728", "panel": "peers"}, doc="fla-core's fused_recurrent, K-major"))
registry.join(FAMILY, FLASHINFER_DECODE)           # the one-row verify (K = 1 only)
def _fi_mtp(name: str, label: str, color: str, doc: str) -> Implementation:
    return register(Implementation(
        name=name, family=FAMILY, label=label, provider="flashinfer", impl="cute-dsl",
        build=_build(name), state_dtypes=("float32", "bfloat16"), gpu_only=True,
        supports=_multi_row, available=fi_available, version=flashinfer_version,
        style={"color": color, "panel": "peers"}, doc=doc))


MTP_SNAPSHOTS = _fi_mtp("flashinfer_mtp_snapshots", "FlashInfer mtp + snapshots", "#e377c2",
                        "FlashInfer's mtp verify on a frozen pool, writing its K snapshots")
MTP_FROZEN = _fi_mtp("flashinfer_mtp_frozen", "FlashInfer mtp, frozen (no buffer)", "#f7b6d2",
                     "FlashInfer's mtp verify on a frozen pool, no snapshot buffer")
registry.join(FAMILY, REPLAYSSM)                   # its verify and flush (replayssm_peer)
