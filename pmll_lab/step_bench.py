"""The speculative step as the unit of measure: verify + accept/commit/restore, N steps at once.

A serving engine pays for the whole step: the verify of ``K`` draft rows and what makes the
accepted rows stick (our carries' accept, the ring's cursor commit, a snapshot verify's restore
of the accepted state, FlashInfer's ReplaySSM commit). ``StepCase`` holds one configuration
(shape, dtypes, batch, ``K``, ``N`` steps of fresh inputs, the acceptance counts of every step
drawn once on the device from the acceptance process); ``build_form`` gives, per form, a
callable running all ``N`` steps with no host sync, so the whole sequence is captured in one
CUDA graph (``step_timing``: graph replay time / ``N``). ``check_form`` runs the same steps
without a graph and compares the accepted rows' outputs and the final states with plain float64
decoding of the accepted rows (``pmll_lab.reference.carry``), before anything is timed.

Forms (the ``form`` column of the step rows):

==============================  ================================================================
``exact_lazy`` / ``exact_eager``  ``gdn_carry_verify`` (exact form, V-major) + ``carry_accept``
``exact_lazy_cuda`` / ``..eager..``  the same with the verify's CUDA C++ twin (``impl="cuda"``)
``ring``                          ``gdn_ring_verify`` + ``ring_accept`` (SPEC §3d)
``chain_restore``                 ``gdn_chain`` with K-1 snapshots + ``gdn_snapshot_restore``
``flashinfer_snapshot_restore``   FlashInfer ``mtp`` (frozen pool, K snapshots) + the restore
``flashinfer_replayssm``          FlashInfer ``ucache_flush`` + its cursor commit (one launch)
==============================  ================================================================

Acceptance (``acceptance_counts``): ``a = 1 +`` the leading accepted drafts, each with
probability ``alpha`` (a truncated geometric; ``alpha = 0.8`` at ``K = 4`` gives a mean of 2.95).
Byte counts (``step_bytes``) are SPEC §4's fewest bytes per sequence and layer with the
write-back / fold fraction and the mean ring or stash fill measured in the check run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.bench import errors, time_cuda_graph
from pmll_lab.carry import (GDN_CARRY_CAP, RING_TOLERANCE, GdnCarry, GdnRing, carry_accept,
                            gdn_carry_flush, gdn_carry_verify, gdn_ring_verify, ring_accept)
from pmll_lab.gdn import gdn_chain
from pmll_lab.ops.gdn.restore import gdn_snapshot_restore
from pmll_lab.peers import flashinfer_mtp_runner, flashinfer_supports, fused_gating
from pmll_lab.peers_replayssm import (ReplaySSMRing, replayssm_commit, replayssm_runner,
                                      replayssm_state, replayssm_supports)
from pmll_lab.reference import carry as ref_carry
from pmll_lab.reference import ring as ref_ring

STEP_FORMS = ("exact_lazy", "exact_eager", "exact_lazy_cuda", "exact_eager_cuda", "ring",
              "chain_restore", "flashinfer_snapshot_restore", "flashinfer_replayssm")
CUDA_FORMS = ("exact_lazy_cuda", "exact_eager_cuda")
"""Forms whose verify is a CUDA C++ twin (``kernels/gdn_carry.cu``): a GPU only."""


def impl_of(name: str) -> str:
    """The ``impl`` column of the rows of a kernel or form ``name`` (a ``:variant`` suffix
    ignored): ``cuda`` for a CUDA C++ twin (``*_cuda``), the peer's name for a peer (``fla``,
    ``flashinfer``), else ``triton`` (ours)."""
    base = name.split(":")[0]
    if base.endswith("_cuda"):
        return "cuda"
    if base.startswith("fla_"):
        return "fla"
    return "flashinfer" if base.startswith("flashinfer") else "triton"


CONV_FORMS = ("conv_carry_lazy", "conv_chain_restore")
"""The conv twin's step (SPEC §3c): its carry (``conv_carry_verify`` lazy + ``carry_accept``)
and its chain with window snapshots + the restore, beside the GDN step; both bitwise equal to
``conv_update`` per accepted row (``check_conv``)."""
OUTPUT_TOL = {"float32": 8e-3, "bfloat16": 2e-2, "float16": 1e-2}
"""rel L2 of a step's accepted outputs (bf16) against float64 decoding, per state dtype: one
bf16 rounding of the outputs (8e-3, as the carry tests), or the 2-byte state's rounding."""


def fill_ring(ring: GdnRing, fill: int, seed: int) -> None:
    """``fill`` realistic rows in every slot's window at a seeded random ``base``: unit keys,
    corrections N(0, 0.3^2), cumulative log decays of ``-softplus(N(0, 1))`` steps; drawn on
    the CPU (the same rows on every device). For timing a verify at a given ring fill."""
    _checks.positive_int("fill", fill, minimum=0, maximum=ring.length)
    gen = torch.Generator().manual_seed(int(seed))
    S, ns = ring.slots, 2 * ring.length
    base = torch.randint(0, ns, (S,), generator=gen, dtype=torch.int32)
    k = torch.nn.functional.normalize(torch.randn(ring.k.shape, generator=gen), dim=-1)
    u = torch.randn(ring.u.shape, generator=gen) * 0.3
    steps = -torch.nn.functional.softplus(torch.randn(S, ring.num_v_heads, ns, generator=gen))
    G = torch.zeros(S, ring.num_v_heads, ns)
    for s in range(S):
        order = [(int(base[s]) + i) % ns for i in range(ns)]
        G[s, :, order] = torch.cumsum(steps[s], -1)
    for dst, src in ((ring.k, k), (ring.u, u), (ring.G, G), (ring.base, base)):
        dst.copy_(src.to(dst))
    ring.len.fill_(fill)


def acceptance_counts(steps: int, batch: int, rows: int, alpha: float, seed: int,
                      device=None) -> torch.Tensor:
    """``[steps, batch]`` int32 on ``device``: ``1 +`` leading accepted drafts of ``rows - 1``,
    each accepted with probability ``alpha``; drawn from a seeded generator on the device."""
    _checks.positive_int("steps", steps)
    _checks.positive_int("rows", rows)
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha: must lie in [0, 1], got {alpha}")
    dev = DEVICE if device is None else torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    u = torch.rand(steps, batch, max(rows - 1, 1), generator=gen, device=dev)
    lead = (u < alpha).to(torch.int32).cumprod(-1).sum(-1) if rows > 1 else 0 * u[..., 0]
    return (1 + lead).to(torch.int32).contiguous()


@dataclass
class StepCase:
    """One configuration of the step benchmark. Inputs are drawn on the CPU from ``seed``
    (bf16-representable gating parameters, so that FlashInfer's bf16 cast of ``A_log`` and
    ``dt_bias`` changes nothing) and moved to ``DEVICE``: per step ``q, k [B, K, HK, kd]``,
    ``v [B, K, HV, vd]``, ``a, b [B, K, HV]`` in ``dtype``; a V-major initial state pool
    ``[B, HV, vd, kd]`` of scale 0.1 in ``state_dtype``; slots a permutation of ``0..B-1``."""

    batch: int
    rows: int = 4
    num_k_heads: int = 16
    num_v_heads: int = 32
    head_dim: int = 128
    steps: int = 16
    alpha: float = 0.8
    dtype: torch.dtype = torch.bfloat16
    state_dtype: torch.dtype = torch.float32
    ring_length: int = 16
    seed: int = 0
    tensors: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        B, K, N = self.batch, self.rows, self.steps
        HK, HV, d = self.num_k_heads, self.num_v_heads, self.head_dim
        gen = torch.Generator().manual_seed(int(self.seed))
        bf = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
        t = dict(q=torch.randn(N, B, K, HK, d, generator=gen),
                 k=torch.randn(N, B, K, HK, d, generator=gen),
                 v=torch.randn(N, B, K, HV, d, generator=gen),
                 a=torch.randn(N, B, K, HV, generator=gen),
                 b=torch.randn(N, B, K, HV, generator=gen))
        t = {n: x.to(self.dtype) for n, x in t.items()}
        t["A_log"] = bf(torch.rand(HV, generator=gen) * 2 - 1)
        t["dt_bias"] = bf(torch.randn(HV, generator=gen) * 0.1)
        t["state"] = (torch.randn(B, HV, d, d, generator=gen) * 0.1).to(self.state_dtype)
        t["slots"] = torch.randperm(B, generator=gen).to(torch.int32)
        self.tensors = {n: x.to(DEVICE) for n, x in t.items()}
        self.tensors["accepted"] = acceptance_counts(N, B, K, self.alpha, self.seed + 1)

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    def rows_of(self, i: int) -> dict:
        """Step ``i``'s row tensors and the gating parameters, as the launchers take them."""
        t = self.tensors
        return dict(q=t["q"][i], k=t["k"][i], v=t["v"][i], a=t["a"][i], b=t["b"][i],
                    A_log=t["A_log"], dt_bias=t["dt_bias"])


class StepForm:
    """One form's N steps on its own copy of the case's state: ``run()`` runs all of them
    (graph-capturable); ``o`` is the last step's output; ``effective_state(b)`` the float64
    K-major state ``[HV, kd, vd]`` sequence ``b``'s slot stands for; ``stats`` what the check
    run counted (folds or write-backs, mean fill)."""

    def __init__(self, name, case, step, effective_state, held_bytes):
        self.name, self.case = name, case
        self._step, self._effective = step, effective_state
        self.bytes_held = held_bytes
        self.o = None
        self.folds, self.fills = [], []

    def step(self, i: int, collect: bool = False):
        """Step ``i``; with ``collect`` also record its folds/write-backs and the fill before
        it (host syncs: the check run only)."""
        self.o, e, fill = self._step(i, collect)
        if collect:
            if e is not None:
                self.folds.append(float((e == 2).float().mean()))
            if fill is not None:
                self.fills.append(float(fill.float().mean()))
        return self.o

    def run(self):
        for i in range(self.case.steps):
            self.step(i)

    def effective_state(self, b: int) -> torch.Tensor:
        return self._effective(b)


def supports(form: str, case: StepCase) -> bool:
    """Whether ``form`` runs this case (FlashInfer's shape and dtype limits)."""
    dt, sd = str(case.dtype).split(".")[1], str(case.state_dtype).split(".")[1]
    if form == "flashinfer_replayssm":
        return replayssm_supports(case.head_dim, case.rows, dt, sd)
    if form == "flashinfer_snapshot_restore":
        return flashinfer_supports(case.head_dim, dt, sd)
    if form in CUDA_FORMS:
        from pmll_lab.ops.gdn.decode_cuda import MAX_KD
        return DEVICE.type == "cuda" and case.head_dim <= MAX_KD
    return True


def build_form(form: str, case: StepCase) -> StepForm:
    """The ``StepForm`` of ``form`` on a fresh copy of ``case``'s state (``ValueError`` naming
    ``form`` for an unknown one; ``RuntimeError`` where FlashInfer is needed and absent)."""
    _checks.choice("form", form, STEP_FORMS)
    t = case.tensors
    B, K, HK, HV, d = case.batch, case.rows, case.num_k_heads, case.num_v_heads, case.head_dim
    state, slots, acc = t["state"].clone(), t["slots"], t["accepted"]
    kv64 = lambda b: state[int(slots[b])].double().transpose(-1, -2).cpu()  # noqa: E731
    if form.startswith("exact_"):
        carry = GdnCarry.empty(B, HV, d, d, cap=GDN_CARRY_CAP)
        lazy, impl = form.startswith("exact_lazy"), impl_of(form)

        def step(i, collect):
            fill = carry.pend[slots.long()].clone() if collect else None
            o, e = gdn_carry_verify(state, carry, **case.rows_of(i), slot_tab=slots, lazy=lazy,
                                    state_layout="vk", scale=case.scale, impl=impl)
            carry_accept(carry, slots, e, acc[i])
            return o, e, fill

        def eff(b):
            # the state this slot stands for: its pending rows folded by the flush kernel on a
            # copy (what serving holds after a flush, bitwise plain decoding's; a float64 fold
            # would round a few bf16 entries differently)
            folded = state.clone()
            gdn_carry_flush([folded], [carry], slots[b:b + 1].contiguous(), state_layout="vk",
                            impl=impl)
            return folded[int(slots[b])].double().transpose(-1, -2).cpu()

        return StepForm(form, case, step, eff, carry.stash_bytes_per_slot + 4)
    if form == "ring":
        ring = GdnRing.empty(B, HK, HV, d, d, length=case.ring_length, dtype=case.state_dtype)

        def step(i, collect):
            fill = ring.len[slots.long()].clone() if collect else None
            o, e = gdn_ring_verify(state, ring, **case.rows_of(i), slot_tab=slots,
                                   scale=case.scale)
            ring_accept(ring, slots, e, acc[i], rows=K)
            return o, e, fill

        def eff(b):
            s = int(slots[b])
            return ref_ring.ring_state(kv64(b), ref_ring.RefRing.from_ring(ring), s)

        return StepForm(form, case, step, eff, ring.bytes_per_slot)
    hb = HV * d * d * state.element_size()
    if form == "chain_restore":
        inter = torch.empty(B, K - 1, HV, d, d, dtype=state.dtype, device=state.device)

        def step(i, collect):
            o = gdn_chain(state, **case.rows_of(i), state_indices=slots, intermediate=inter,
                          state_layout="vk", scale=case.scale)
            gdn_snapshot_restore(state, inter, slots, acc[i], last_in_place=True)
            return o, None, None

        return StepForm(form, case, step, kv64, (K - 1) * hb)
    if form == "flashinfer_snapshot_restore":
        inter = torch.zeros(B, K, HV, d, d, dtype=state.dtype, device=state.device)
        out = torch.zeros(B, K, HV, d, dtype=torch.bfloat16, device=state.device)
        runs = []
        for i in range(case.steps):
            r = case.rows_of(i)
            run, _ = flashinfer_mtp_runner(r["q"], r["k"], r["v"], r["A_log"], r["a"],
                                           r["dt_bias"], r["b"], state, slots, scale=case.scale,
                                           snapshots=True, frozen=True, out=out,
                                           intermediate=inter)
            runs.append(run)

        def step(i, collect):
            runs[i]()
            gdn_snapshot_restore(state, inter, slots, acc[i], last_in_place=False)
            return out, None, None

        return StepForm(form, case, step, kv64, K * hb)
    fr = ReplaySSMRing.empty(B, B, HK, HV, d, d, state.device)
    flush_min = 16 - K + 1
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

    return StepForm(form, case, step,
                    lambda b: replayssm_state(state, fr, b, int(slots[b])), fr.bytes_per_slot)


def check_form(sf: StepForm, *, ref_seqs: int = 4) -> dict:
    """Run ``sf``'s steps without a graph and check the first ``ref_seqs`` sequences: every
    step's accepted outputs, and the final effective states, against float64 decoding of the
    accepted rows. Returns ``{"o_rel_l2", "state_rel_l2"`` (worst step / slot),
    ``"tolerance", "passed", "fold_frac"`` (folds or write-backs per verify),
    ``"mean_fill"}`` (ring length, pending rows or FlashInfer's ``hist_len`` before a verify).
    Call it on a fresh ``build_form``."""
    case = sf.case
    t = case.tensors
    n = min(ref_seqs, case.batch)
    sd = str(case.state_dtype).split(".")[1]
    ref = t["state"][:].double().transpose(-1, -2).cpu()
    slots = t["slots"][:n].cpu()
    worst_o = 0.0
    for i in range(case.steps):
        o = sf.step(i, collect=True)
        r = case.rows_of(i)
        g, beta = fused_gating(r["A_log"].cpu(), r["a"][:n].cpu(), r["dt_bias"].cpu(),
                               r["b"][:n].cpu())
        rows = (r["q"][:n].cpu(), r["k"][:n].cpu(), r["v"][:n].cpu(), g, beta)
        o_ref = ref_carry.decode_tokens(ref.clone(), *rows, slots, scale=case.scale)
        acc = t["accepted"][i][:n].cpu()
        for b in range(n):
            a = int(acc[b])
            worst_o = max(worst_o, errors(o[b, :a].float().cpu(), o_ref[b, :a])["rel_l2"])
            ref_carry.decode_tokens(ref, *(x[b:b + 1, :a] for x in rows), slots[b:b + 1],
                                    scale=case.scale)
    worst_s = max(errors(sf.effective_state(b), ref[int(slots[b])])["rel_l2"] for b in range(n))
    tol = max(OUTPUT_TOL[sd], RING_TOLERANCE[sd] if sf.name != "ring" else 0.0)
    mean = lambda x: sum(x) / len(x) if x else 0.0  # noqa: E731
    return {"o_rel_l2": worst_o, "state_rel_l2": worst_s, "tolerance": tol,
            "passed": worst_o <= tol and worst_s <= tol, "fold_frac": mean(sf.folds),
            "mean_fill": mean(sf.fills)}


def step_timing(sf: StepForm) -> dict | None:
    """Graph-replay time of ``sf``'s ``N`` steps captured in one CUDA graph, per step:
    ``{"step_us", "p20_us", "p80_us"}`` (None on the CPU)."""
    t = time_cuda_graph(sf.run, replays=100)
    if t is None:
        return None
    n = sf.case.steps
    return {"step_us": t["median_us"] / n, "p20_us": t["p20_us"] / n, "p80_us": t["p80_us"] / n}


def step_bytes(form: str, case: StepCase, fold_frac: float, mean_fill: float) -> int:
    """SPEC §4's fewest bytes one step moves per sequence and layer: the state read, the
    state written where the step writes it (``fold_frac`` of the steps for the carries, every
    step for the chain, the restores' two state moves where ``a < K`` or always), history rows
    read (``mean_fill``) and written (``K``), inputs and outputs."""
    K, HK, HV, d = case.rows, case.num_k_heads, case.num_v_heads, case.head_dim
    s = torch.finfo(case.state_dtype).bits // 8
    i = torch.finfo(case.dtype).bits // 8
    hb = HV * d * d * s
    io = K * (2 * HK * d + HV * d + 2 * HV) * i + K * HV * d * 2
    restore_frac = 1 - case.alpha ** (K - 1)             # P(a < K)
    if form.startswith("exact_"):
        row = HV * (2 * d + 1) * 4
        return int(hb * (1 + fold_frac) + row * (mean_fill + K) + io)
    if form in ("ring", "flashinfer_replayssm"):
        rs = s if form == "ring" else 2
        row = (HK * d + HV * d) * rs + HV * 4
        return int(hb * (1 + fold_frac) + row * (mean_fill + K) + io)
    if form == "chain_restore":
        return int(hb * (K + 1) + 2 * hb * restore_frac + io)
    return int(hb * (K + 1) + 2 * hb + io)               # FlashInfer mtp: K snapshots, restore


def _conv_inputs(case: StepCase) -> dict:
    """The conv twin's inputs for ``case``: per step ``x [B, K, dim]`` (``dim = 2 HK kd +
    HV vd``, Qwen3-Next's fused qkv), weight ``[dim, 4]``, a window pool ``[B, dim, 3]``, all in
    ``case.dtype``; drawn on the CPU from ``seed + 2``."""
    gen = torch.Generator().manual_seed(int(case.seed) + 2)
    HK, HV, d = case.num_k_heads, case.num_v_heads, case.head_dim
    dim = 2 * HK * d + HV * d
    t = dict(x=torch.randn(case.steps, case.batch, case.rows, dim, generator=gen),
             weight=torch.randn(dim, 4, generator=gen) * 0.5,
             window=torch.randn(case.batch, dim, 3, generator=gen))
    out = {n: v.to(case.dtype).to(DEVICE) for n, v in t.items()}
    out.update(qk_channels=2 * HK * d, head_dim=d)
    return out


def build_conv_form(form: str, case: StepCase):
    """``(step(i) -> y, window)`` of a conv twin form on a fresh copy of the window pool."""
    from pmll_lab.conv import ConvCarry, conv_carry_verify, conv_chain

    _checks.choice("form", form, CONV_FORMS)
    c = _conv_inputs(case)
    window, slots, acc = c["window"].clone(), case.tensors["slots"], case.tensors["accepted"]
    kw = dict(qk_channels=c["qk_channels"], head_dim=c["head_dim"])
    if form == "conv_carry_lazy":
        carry = ConvCarry.empty(case.batch, window.shape[1], cap=GDN_CARRY_CAP,
                                dtype=case.dtype)

        def step(i):
            y, e = conv_carry_verify(window, carry, c["x"][i], c["weight"], slot_tab=slots,
                                     lazy=True, **kw)
            carry_accept(carry, slots, e, acc[i])
            return y

        return step, window, carry
    inter = torch.empty(case.batch, case.rows - 1, *window.shape[1:], dtype=window.dtype,
                        device=window.device)

    def step(i):
        y = conv_chain(window, c["x"][i], c["weight"], state_indices=slots, intermediate=inter,
                       **kw)
        gdn_snapshot_restore(window, inter, slots, acc[i], last_in_place=True)
        return y

    return step, window, None


def check_conv(form: str, case: StepCase) -> bool:
    """Run a conv form's steps and compare every accepted output row and the final windows
    (the carry's pending inputs shifted in) bitwise with ``conv_update`` per accepted row."""
    from pmll_lab.conv import conv_carry_flush, conv_update
    from pmll_lab.bench import bitwise_equal

    c = _conv_inputs(case)
    step, window, carry = build_conv_form(form, case)
    plain, slots = c["window"].clone(), case.tensors["slots"]
    ok = True
    for i in range(case.steps):
        y = step(i)
        acc = case.tensors["accepted"][i]
        for row in range(case.rows):
            live = torch.where(acc > row, slots, -1).to(torch.int32)
            yr = conv_update(plain, c["x"][i][:, row], c["weight"], state_indices=live,
                             qk_channels=c["qk_channels"], head_dim=c["head_dim"])
            m = (acc > row).cpu()
            ok &= bitwise_equal(y[:, row][m.to(y.device)], yr[m.to(yr.device)])
    if carry is not None:
        conv_carry_flush([window], [carry], slots)
    return bool(ok and bitwise_equal(window, plain))


def conv_step_timing(form: str, case: StepCase) -> dict | None:
    """µs per step of a conv form, the ``steps`` steps captured in one CUDA graph."""
    step, *_ = build_conv_form(form, case)
    t = time_cuda_graph(lambda: [step(i) for i in range(case.steps)], replays=100)
    if t is None:
        return None
    return {"step_us": t["median_us"] / case.steps, "p20_us": t["p20_us"] / case.steps,
            "p80_us": t["p80_us"] / case.steps}
