"""Every implementation of the ``gdn_step`` family (``harness.step``), registered once.

Ours: the exact carried state (lazy and eager; its CUDA C++ twin), the ring form, the chain with
snapshots and the restore. FlashInfer's: its ``mtp`` verify with snapshots + our restore, and its
ReplaySSM ring (``ucache_flush`` + its cursor commit). Each builder returns a ``StepForm`` over a
fresh copy of the case's state, V-major (``[B, HV, vd, kd]``: the peers' layout).
"""

from __future__ import annotations

import torch

from pmll_lab import sizes
from pmll_lab.carry import (GDN_CARRY_CAP, GdnCarry, GdnRing, carry_accept, carry_accept_spec,
                            gdn_carry_flush, gdn_carry_verify, gdn_ring_verify, ring_accept)
from pmll_lab.gdn import gdn_chain, gdn_decode
from pmll_lab.harness.registry import Implementation, register
from pmll_lab.harness import step as step_module
from pmll_lab.harness.step import StepCase, StepForm, folds_when_full, folds_when_pending
from pmll_lab.ops.carry.ring import RING_HEAD_DIMS
from pmll_lab.ops.gdn.restore import gdn_snapshot_restore
from pmll_lab.peers import (flashinfer_available, flashinfer_mtp_runner, flashinfer_status,
                            flashinfer_supports, flashinfer_version)
from pmll_lab.peers_replayssm import (REPLAYSSM_WINDOW, ReplaySSMRing, replayssm_commit,
                                      replayssm_runner, replayssm_state, replayssm_supports)
from pmll_lab.reference import ring as ref_ring


def dims(case: StepCase) -> dict:
    """The case's sizes as ``pmll_lab.sizes`` takes them."""
    return dict(K=case.rows, HK=case.num_k_heads, HV=case.num_v_heads, D=case.head_dim,
                dtype=case.dtype, state_dtype=case.state_dtype)


def kv64(state, slots):
    return lambda b: state[int(slots[b])].double().transpose(-1, -2).cpu()


def fresh(case: StepCase):
    """A copy of the case's state pool, and its slots and accepted counts (shared, not
    copied)."""
    t = case.tensors
    return t["state"].clone(), t["slots"], t["accepted"]


def _flushed(state, carry, slots, impl: str = "triton"):
    """The effective state of an exact form: the slot's pending rows folded by the flush kernel
    on a copy (what serving holds after a flush, bitwise plain decoding's)."""
    def effective(b):
        folded = state.clone()
        gdn_carry_flush([folded], [carry], slots[b:b + 1].contiguous(), state_layout="vk",
                        impl=impl)
        return kv64(folded, slots)(b)
    return effective


def build_exact(case: StepCase, *, lazy: bool, impl: str = "triton", name: str = "") -> StepForm:
    """``gdn_carry_verify`` (exact form) + ``carry_accept``, lazy or eager."""
    state, slots, acc = fresh(case)
    d = case.head_dim
    carry = GdnCarry.empty(case.batch, case.num_v_heads, d, d, cap=GDN_CARRY_CAP)

    def step(i, collect):
        fill = carry.pend[slots.long()].clone() if collect else None
        o, e = gdn_carry_verify(state, carry, **case.rows_of(i), slot_tab=slots, lazy=lazy,
                                state_layout="vk", scale=case.scale, impl=impl)
        carry_accept(carry, slots, e, acc[i])
        return o, e, fill

    rule = folds_when_full(GDN_CARRY_CAP) if lazy else folds_when_pending()
    return StepForm(name, case, step, _flushed(state, carry, slots, impl),
                    carry.stash_bytes_per_slot + 4,
                    folds_when=rule, cursors=lambda: [carry.pend, state])


def build_exact_spec(case: StepCase, name: str = "") -> StepForm:
    """The exact lazy form with the speculative store: each verify also writes the state after
    all ``K`` rows to a spare slot (``spec_slot_tab``), and ``carry_accept_spec`` swaps to it
    when all ``K`` rows are accepted, so the next verify replays nothing. Two slots (state and
    stash) per sequence: the pool is doubled, the spares after the case's slots."""
    t = case.tensors
    S = t["state"].shape[0]
    state = torch.cat([t["state"], t["state"]]).contiguous()
    slots = t["slots"].clone()
    spare = slots + S
    acc = t["accepted"]
    d = case.head_dim
    carry = GdnCarry.empty(2 * S, case.num_v_heads, d, d, cap=GDN_CARRY_CAP)

    def step(i, collect):
        fill = carry.pend[slots.long()].clone() if collect else None
        o, e = gdn_carry_verify(state, carry, **case.rows_of(i), slot_tab=slots, lazy=True,
                                state_layout="vk", scale=case.scale, spec_slot_tab=spare)
        carry_accept_spec(carry, slots, spare, e, acc[i], rows=case.rows)
        return o, e, fill

    held = 2 * carry.stash_bytes_per_slot + 8 + sizes.state_bytes(
        case.num_v_heads, d, d, case.state_dtype)
    return StepForm(name, case, step, _flushed(state, carry, slots), held,
                    folds_when=folds_when_full(GDN_CARRY_CAP),
                    cursors=lambda: [carry.pend, state, slots], full_resets=True)


def build_ring(case: StepCase, name: str | None = None) -> StepForm:
    """``gdn_ring_verify`` + ``ring_accept`` (SPEC §3d), ring rows in the state's dtype."""
    name = RING.name if name is None else name
    state, slots, acc = fresh(case)
    d = case.head_dim
    ring = GdnRing.empty(case.batch, case.num_k_heads, case.num_v_heads, d, d,
                         length=case.ring_length, dtype=case.state_dtype)

    def step(i, collect):
        fill = ring.len[slots.long()].clone() if collect else None
        o, e = gdn_ring_verify(state, ring, **case.rows_of(i), slot_tab=slots, scale=case.scale)
        ring_accept(ring, slots, e, acc[i], rows=case.rows)
        return o, e, fill

    start64 = kv64(state, slots)
    return StepForm(name, case, step,
                    lambda b: ref_ring.ring_state(start64(b), ref_ring.RefRing.from_ring(ring),
                                                  int(slots[b])),
                    ring.bytes_per_slot, folds_when=folds_when_full(case.ring_length),
                    cursors=lambda: [ring.len, ring.base, state])


def build_chain_restore(case: StepCase, name: str | None = None) -> StepForm:
    """``gdn_chain`` with ``K - 1`` snapshots + ``gdn_snapshot_restore`` of the accepted one."""
    name = CHAIN_RESTORE.name if name is None else name
    state, slots, acc = fresh(case)
    K, HV, d = case.rows, case.num_v_heads, case.head_dim
    inter = torch.empty(case.batch, K - 1, HV, d, d, dtype=state.dtype, device=state.device)

    def step(i, collect):
        o = gdn_chain(state, **case.rows_of(i), state_indices=slots, intermediate=inter,
                      state_layout="vk", scale=case.scale)
        gdn_snapshot_restore(state, inter, slots, acc[i], last_in_place=True)
        return o, None, None

    return StepForm(name, case, step, kv64(state, slots),
                    sizes.snapshot_bytes(K, HV, d, d, case.state_dtype), cursors=lambda: [state])


def build_plain(case: StepCase, impl: str = "triton", name: str | None = None) -> StepForm:
    """``gdn_decode`` once per accepted row (padding lanes for sequences that accepted fewer) on
    its own copy of the state: plain decoding of the accepted tokens, what the exact forms must
    equal to the bit. ``impl``: the decode's (a CUDA twin's exact forms answer to the CUDA
    decode)."""
    name = PLAIN.name if name is None else name
    state, slots, acc = fresh(case)
    o = torch.zeros(case.batch, case.rows, case.num_v_heads, case.head_dim,
                    dtype=torch.bfloat16, device=state.device)

    def step(i, collect):
        r = case.rows_of(i)
        o.zero_()
        for row in range(case.rows):
            live = torch.where(acc[i] > row, slots, -1).to(torch.int32)
            o[:, row] = gdn_decode(
                state, r["q"][:, row], r["k"][:, row], r["v"][:, row], A_log=r["A_log"],
                a=r["a"][:, row], dt_bias=r["dt_bias"], b=r["b"][:, row], state_indices=live,
                state_layout="vk", scale=case.scale, impl=impl)
        return o, None, None

    return StepForm(name, case, step, kv64(state, slots), 0, cursors=lambda: [state])



step_module.PLAIN = build_plain      # the plain decoding every form's check compares with

def build_flashinfer_snapshots(case: StepCase, name: str = "") -> StepForm:
    """FlashInfer ``mtp`` on a frozen pool with its ``K`` snapshots, + our restore."""
    state, slots, acc = fresh(case)
    B, K, HV, d = case.batch, case.rows, case.num_v_heads, case.head_dim
    inter = torch.zeros(B, K, HV, d, d, dtype=state.dtype, device=state.device)
    out = torch.zeros(B, K, HV, d, dtype=torch.bfloat16, device=state.device)
    runs = []
    for i in range(case.steps):
        r = case.rows_of(i)
        run, _ = flashinfer_mtp_runner(r["q"], r["k"], r["v"], r["A_log"], r["a"], r["dt_bias"],
                                       r["b"], state, slots, scale=case.scale, snapshots=True,
                                       frozen=True, out=out, intermediate=inter)
        runs.append(run)

    def step(i, collect):
        runs[i]()
        gdn_snapshot_restore(state, inter, slots, acc[i], last_in_place=False)
        return out, None, None

    return StepForm(name, case, step, kv64(state, slots),
                    sizes.snapshot_bytes(K + 1, HV, d, d, case.state_dtype),
                    cursors=lambda: [state])


def build_flashinfer_replayssm(case: StepCase, name: str = "") -> StepForm:
    """FlashInfer's ReplaySSM: ``ucache_flush`` (verify, folding a full window first) + its
    caller-owned cursor commit, one launch each."""
    state, slots, acc = fresh(case)
    B, K, HK, HV, d = case.batch, case.rows, case.num_k_heads, case.num_v_heads, case.head_dim
    fr = ReplaySSMRing.empty(B, B, HK, HV, d, d, state.device)
    flush_min = REPLAYSSM_WINDOW - K + 1
    out = torch.zeros(B, K, HV, d, dtype=torch.bfloat16, device=state.device)
    runs = []
    for i in range(case.steps):
        r = case.rows_of(i)
        run, _ = replayssm_runner(r["q"], r["k"], r["v"], r["A_log"], r["a"], r["dt_bias"],
                                  r["b"], state, slots, fr, scale=case.scale,
                                  flush_min=flush_min, out=out)
        runs.append(run)

    def step(i, collect):
        fill = fr.hist_len.clone() if collect else None
        e = (fill >= flush_min).to(torch.int32) + 1 if collect else None
        runs[i]()
        replayssm_commit(fr, acc[i], flush_min)
        return out, e, fill

    return StepForm(name, case, step, lambda b: replayssm_state(state, fr, b, int(slots[b])),
                    fr.bytes_per_slot, folds_when=folds_when_full(REPLAYSSM_WINDOW),
                    cursors=lambda: [fr.hist_len, fr.cache_base, state])


def _carry_bytes(c, f, spec_store=False):
    return sizes.carry_step_bytes(**dims(c), fold_frac=f["fold_frac"], mean_fill=f["mean_fill"],
                                  spec_store=spec_store)


def cuda_supports(case) -> str | None:
    from pmll_lab.ops.gdn.decode_cuda import MAX_KD

    return None if case.head_dim <= MAX_KD else f"head_dim {case.head_dim} > {MAX_KD}"


def fi_supports(case) -> str | None:
    dt, sd = (str(x).removeprefix("torch.") for x in (case.dtype, case.state_dtype))
    if dt != "bfloat16":
        return f"writes bf16 outputs (inputs {dt})"
    return None if flashinfer_supports(case.head_dim, dt, sd) else "shape or dtype not taken"


def _replayssm_supports(case) -> str | None:
    dt, sd = (str(x).removeprefix("torch.") for x in (case.dtype, case.state_dtype))
    ok = replayssm_supports(case.head_dim, case.rows, dt, sd)
    return None if ok else "shape, K or dtype not taken"


def fi_available() -> str | None:
    """Why FlashInfer does not run here (None: it does)."""
    return None if flashinfer_available() else flashinfer_status()


FAMILY = "gdn_step"
EXACT_LAZY, EXACT_LAZY_CUDA, EXACT_EAGER, EXACT_EAGER_CUDA = (
    register(Implementation(
        name=name, family=FAMILY, exact=True, impl=impl, gpu_only=impl == "cuda",
        label=f"carry exact, {'lazy' if lazy else 'eager'}"
              + (", CUDA C++ twin" if impl == "cuda" else ""),
        build=lambda c, lazy=lazy, impl=impl, name=name: build_exact(c, lazy=lazy,
                                                                    impl=impl, name=name),
        supports=cuda_supports if impl == "cuda" else None, bytes=_carry_bytes,
        style={"color": color}, drift=drift,
        plain=lambda c, impl=impl: build_plain(c, impl),
        doc="SPEC §3b: the stash replays pending rows; bitwise plain decoding"))
    for name, lazy, impl, color, drift in (
        ("exact_lazy", True, "triton", "#1f77b4", ("bfloat16",)),
        ("exact_lazy_cuda", True, "cuda", "#ff7f0e", ()),
        ("exact_eager", False, "triton", "#aec7e8", ()),
        ("exact_eager_cuda", False, "cuda", "#ffbb78", ())))
"""The exact forms (SPEC §3b), lazy and eager, Triton and their CUDA C++ twins."""
EXACT_SPEC = register(Implementation(
    name="exact_spec", family=FAMILY, exact=True, label="carry exact, lazy + speculative store",
    build=build_exact_spec, style={"color": "#393b79"}, plain=build_plain,
    bytes=lambda c, f: _carry_bytes(c, f, spec_store=True),
    doc="SPEC §3b with the full-acceptance state stored ahead in a spare slot: bitwise plain "
        "decoding, fewer rows replayed, one more state write per step and a second slot"))
def ring_supports(case) -> str | None:
    """Why the ring form cannot run ``case`` (None: it can): its ``tl.dot`` tiles take head
    sizes that are multiples of 16 in ``RING_HEAD_DIMS``."""
    lo, hi = RING_HEAD_DIMS
    d = case.head_dim
    return None if d % 16 == 0 and lo <= d <= hi else \
        f"head size {d}: the ring form takes multiples of 16 in [{lo}, {hi}]"


RING = register(Implementation(
    name="ring", family=FAMILY, label="carry ring (tolerance form)", build=build_ring,
    style={"color": "#17becf"}, drift=("bfloat16", "float32"), supports=ring_supports,
    bytes=lambda c, f: sizes.ring_step_bytes(**dims(c), fold_frac=f["fold_frac"],
                                             mean_fill=f["mean_fill"]),
    doc="SPEC §3d: read-only state, accepted rows in a ring, tensor-core correction"))
CHAIN_RESTORE = register(Implementation(
    name="chain_restore", family=FAMILY, exact=True, label="chain + snapshots + restore",
    build=build_chain_restore, plain=build_plain, style={"color": "#2ca02c"},
    bytes=lambda c, f: sizes.snapshot_step_bytes(
        **dims(c), writes=c.rows, restore_frac=1 - c.alpha ** (c.rows - 1)),
    doc="SPEC §3a: the baseline, one snapshot per draft row"))
PLAIN = register(Implementation(
    name="plain_decode", family=FAMILY, exact=True, label="plain decoding",
    style={"color": "#000000"}, drift=("bfloat16",), plain=build_plain,   # run to run the same
    build=build_plain, bytes=lambda c, f: sizes.snapshot_step_bytes(
        **dims(c), writes=c.rows, restore_frac=0.0) + (c.rows - 1) * sizes.state_bytes(
        c.num_v_heads, c.head_dim, c.head_dim, c.state_dtype),
    doc="one decode per accepted token: the answer every form owes, at K state round trips"))
SNAPSHOT_RESTORE = register(Implementation(
    name="flashinfer_snapshot_restore", family=FAMILY, provider="flashinfer", impl="cute-dsl",
    label="FlashInfer mtp + snapshots + restore", build=build_flashinfer_snapshots,
    style={"color": "#e377c2"},
    state_dtypes=("float32", "bfloat16"), gpu_only=True, supports=fi_supports,
    available=fi_available, version=flashinfer_version,
    bytes=lambda c, f: sizes.snapshot_step_bytes(**dims(c), writes=c.rows, restore_frac=1.0)))
REPLAYSSM = register(Implementation(
    name="flashinfer_replayssm", family=FAMILY, provider="flashinfer", impl="cute-dsl",
    label="FlashInfer ReplaySSM (ucache_flush + commit)", build=build_flashinfer_replayssm,
    style={"color": "#c49c94", "panel": "peers"}, drift=("bfloat16",),
    state_dtypes=("bfloat16",), gpu_only=True, supports=_replayssm_supports,
    available=fi_available, version=flashinfer_version,
    bytes=lambda c, f: sizes.ring_step_bytes(**dims(c), fold_frac=f["fold_frac"],
                                             mean_fill=f["mean_fill"],
                                             ring_dtype=torch.bfloat16)))
