"""SGLang's speculative steps as implementations of the ``gdn_step`` family (``harness.step``).

Each builder returns a ``StepForm`` over a ``StepCase`` with the contract of every step form
(``harness.step_forms``): its own copy of the case's V-major state pool, ``run()`` the case's
``N`` steps with no host sync (graph-capturable), ``effective_state(b)`` the float64 K-major
``[HV, kd, vd]`` state sequence ``b``'s slot stands for, ``bytes_held`` per sequence. A step is
driven as SGLang drives it, with its own buffers and cursors (``pmll_lab.peers_sglang``, whose
docstring gives the calls):

==============================  ================================================================
``sglang_exact_fold``           the recurrent kernel over the ``K`` rows, state not written, raw
                                rows stored; the accepted prefix folded into the state
``sglang_replayssm``            its ReplaySSM ring as its GDN backend drives it: verify; cursor
                                advance; materialisation of the windows it flags
``sglang_replayssm_rawfold``    the ring with its exact fold (the kernel module's own
                                three-launch mode): raw rows replayed into the state at a flush
==============================  ================================================================

The runner (``harness.runner``) checks and times these forms as it does ours; each also
carries its buffers for inspection (``window``: ``SglangFoldWindow``; ``ring``: ``SglangRing``). A fold (the
runner's ``fold_frac``) is a step whose commit folds (every step for the exact fold); the fill
(``mean_fill``) is the ring's ``write_pos`` before the verify (0 for the exact fold). Their
cursors follow SGLang's own rules (tests/experiments/test_peers_sglang.py replays them), not the
``folds_when`` rule the runner audits ours with; a timed graph must still advance them.
"""

from __future__ import annotations

import torch

from pmll_lab import _checks, sizes
from pmll_lab.peers_sglang import (INPUT_DTYPES, SglangFoldWindow, SglangRing,
                                   exact_fold_supports, fold_commit, fold_verify, require,
                                   ring_advance, ring_materialize, ring_state, ring_supports,
                                   ring_verify, sglang_available, sglang_status,
                                   sglang_version)
from pmll_lab.harness.registry import Implementation, register
from pmll_lab.harness.step import StepCase, StepForm

EXACT_FOLD, REPLAYSSM, REPLAYSSM_RAWFOLD = (
    "sglang_exact_fold", "sglang_replayssm", "sglang_replayssm_rawfold")
"""The three forms' registry names, written here only (registered at the end of the module)."""
FORMS = (EXACT_FOLD, REPLAYSSM, REPLAYSSM_RAWFOLD)
LABELS = {EXACT_FOLD: "SGLang fold-every-commit (exact carried state)",
          REPLAYSSM: "SGLang ReplaySSM ring (verify + commit)",
          REPLAYSSM_RAWFOLD: "SGLang ReplaySSM ring, exact fold at flush"}
RING_LAYOUT = {REPLAYSSM: "compact", REPLAYSSM_RAWFOLD: "raw"}


def available() -> bool:
    """SGLang's kernels load here (``pmll_lab.peers_sglang.sglang_available``)."""
    return sglang_available()


def peer_version() -> str:
    """The ``peer_version`` column of these forms' rows ("" where SGLang does not load)."""
    return sglang_version()


def supports(form: str, case: StepCase) -> bool:
    """Whether ``form`` takes this case's shape and dtypes (not whether SGLang is installed:
    ``available``). ``ValueError`` naming ``form`` for one not in ``FORMS``."""
    _checks.choice("form", form, FORMS)
    if form == EXACT_FOLD:
        return exact_fold_supports(case.head_dim, case.rows, case.dtype, case.state_dtype)
    return ring_supports(case.head_dim, case.rows, case.dtype, case.state_dtype,
                         case.ring_length)


def unsupported(form: str, case: StepCase) -> str | None:
    """None where ``form`` takes the case (``supports``), else what it does not take."""
    if supports(form, case):
        return None
    dt, sd = (str(d).removeprefix("torch.") for d in (case.dtype, case.state_dtype))
    if form == EXACT_FOLD:
        return f"inputs {dt} with a {sd} state not taken (inputs {', '.join(INPUT_DTYPES)})"
    return (f"head size {case.head_dim}, K = {case.rows}, ring length {case.ring_length}, "
            f"inputs {dt} not taken (a head size a power of two >= 32, a ring length a power of "
            f"two >= 16 and >= 2K, inputs {', '.join(INPUT_DTYPES)})")


def build_form(form: str, case: StepCase) -> StepForm:
    """The ``StepForm`` of ``form`` on a fresh copy of ``case``'s state. ``ValueError`` naming
    ``form`` for an unknown one or one that does not take the case (``supports``);
    ``RuntimeError`` where SGLang's kernels do not load."""
    _checks.choice("form", form, FORMS)
    if not supports(form, case):
        raise ValueError(f"form: {form} does not take this case (head_dim={case.head_dim}, "
                         f"K={case.rows}, dtype={case.dtype}, state_dtype={case.state_dtype}, "
                         f"ring_length={case.ring_length})")
    kern = require()
    if form == EXACT_FOLD:
        return _exact_fold(kern, case)
    return _ring(kern, case, form)


def _common(case: StepCase):
    """A copy of the state pool, the slots, the accepted counts, ``query_start_loc``."""
    t = case.tensors
    B, K = case.batch, case.rows
    qsl = torch.arange(0, B * K + 1, K, dtype=torch.int32, device=t["state"].device)
    return t["state"].clone(), t["slots"], t["accepted"], qsl


def _exact_fold(kern, case: StepCase) -> StepForm:
    state, slots, acc, qsl = _common(case)
    B, K, HK, HV, d = case.batch, case.rows, case.num_k_heads, case.num_v_heads, case.head_dim
    window = SglangFoldWindow.empty(B, HK, HV, d, d, K, case.dtype, device=state.device)
    folds = torch.full((B,), 2, dtype=torch.int32, device=state.device)
    empty = torch.zeros(B, dtype=torch.int32, device=state.device)

    def step(i, collect):
        o = fold_verify(kern, state, slots, window, **case.rows_of(i), scale=case.scale,
                        query_start_loc=qsl)
        fold_commit(kern, state, window, slots, acc[i])
        return (o, folds, empty) if collect else (o, None, None)

    def eff(b):
        return state[int(slots[b])].double().transpose(-1, -2).cpu()

    sf = StepForm(EXACT_FOLD, case, step, eff, window.bytes_per_slot,
                  cursors=lambda: [state])
    sf.window = window
    return sf


def _ring(kern, case: StepCase, form: str) -> StepForm:
    state, slots, acc, qsl = _common(case)
    B, K, HK, HV, d = case.batch, case.rows, case.num_k_heads, case.num_v_heads, case.head_dim
    layout = RING_LAYOUT[form]
    ring = SglangRing.empty(B, HK, HV, d, d, case.ring_length, case.dtype, layout=layout,
                            device=state.device)
    replay = torch.arange(B, dtype=torch.int32, device=state.device)   # request rows
    out = torch.zeros(B * K, HV, d, dtype=case.dtype, device=state.device)
    compact = layout == "compact"
    every_commit = compact and case.state_dtype != torch.float32

    def step(i, collect):
        fill = ring.write_pos.clone() if collect else None
        e = None
        if collect and not compact:                       # flagged at the last commit
            e = ring.is_flush.to(torch.int32) + 1
        ring_verify(kern, state, slots, replay, ring, **case.rows_of(i), scale=case.scale,
                    query_start_loc=qsl, out=out)
        ring_advance(kern, ring, replay, acc[i], K, every_commit)
        if compact:
            if collect:
                e = ring.is_flush.to(torch.int32) + 1
            ring_materialize(kern, state, slots, replay, ring, acc[i])
        return out.view(B, K, HV, d), e, fill

    def eff(b):
        return ring_state(state, ring, b, int(slots[b]))

    sf = StepForm(form, case, step, eff, ring.bytes_per_slot,
                  cursors=lambda: [ring.write_pos, ring.cache_base, state])
    sf.ring = ring
    return sf


def step_bytes(form: str, case: StepCase, fold_frac: float, mean_fill: float) -> int:
    """The fewest bytes one step of ``form`` moves per sequence and layer (``sizes``:
    ``sglang_fold_step_bytes``, ``sglang_ring_step_bytes``) with ``fold_frac`` and
    ``mean_fill`` as ``check_form`` measures them and the case's mean accepted rows."""
    _checks.choice("form", form, FORMS)
    mean_accept = float(case.tensors["accepted"].float().mean())
    shape = (case.num_k_heads, case.num_v_heads, case.head_dim, case.head_dim)
    if form == EXACT_FOLD:
        return sizes.sglang_fold_step_bytes(case.rows, mean_accept, *shape, case.dtype,
                                            case.state_dtype)
    return sizes.sglang_ring_step_bytes(case.rows, fold_frac, mean_fill, mean_accept, *shape,
                                        case.dtype, case.state_dtype, RING_LAYOUT[form])


def bytes_held(form: str, case: StepCase) -> int:
    """Bytes ``form`` holds per sequence and layer beside the state (``sizes``:
    ``sglang_fold_bytes_per_seq``, ``sglang_ring_bytes_per_seq``), without building it."""
    _checks.choice("form", form, FORMS)
    shape = (case.num_k_heads, case.num_v_heads, case.head_dim, case.head_dim)
    if form == EXACT_FOLD:
        return sizes.sglang_fold_bytes_per_seq(case.rows, *shape, case.dtype)
    return sizes.sglang_ring_bytes_per_seq(case.ring_length, *shape, case.dtype,
                                           RING_LAYOUT[form])


COLORS = {EXACT_FOLD: "#393b79", REPLAYSSM: "#8c6d31", REPLAYSSM_RAWFOLD: "#bd9e39"}
for _form in FORMS:
    register(Implementation(
        name=_form, family="gdn_step", label=LABELS[_form], provider="sglang", impl="triton",
        build=lambda c, f=_form: build_form(f, c),
        supports=lambda c, f=_form: unsupported(f, c),
        available=lambda: None if sglang_available() else sglang_status(),
        version=sglang_version, state_dtypes=("float32", "bfloat16"),
        bytes=lambda c, facts, f=_form: step_bytes(f, c, facts["fold_frac"], facts["mean_fill"]),
        style={"color": COLORS[_form]}, drift=("bfloat16", "float32")))
