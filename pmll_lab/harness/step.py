"""The ``gdn_step`` family: the whole speculative step, verify + accept/commit/restore, N at once.

A serving engine pays for the whole step: the verify of ``K`` draft rows and what makes the
accepted rows stick (our carries' accept, the ring's cursor commit, a snapshot verify's restore
of the accepted state, a peer's commit or fold). ``StepCase`` holds one configuration (shape,
dtypes, batch, ``K``, ``N`` steps of fresh inputs, the accepted counts of every step drawn once
on the device from the acceptance process). An implementation's ``build(case)`` gives a
``StepForm`` running all ``N`` steps with no host sync, so the whole sequence is captured in one
CUDA graph (``harness.runner``: graph replay time / ``N``). ``check`` runs the same steps
without a graph and compares the accepted rows' outputs and the final states with float64
decoding of the accepted rows (``pmll_lab.reference.carry``), audits the cursors against the
acceptance process, and for the exact forms compares the states bitwise with plain decoding.

Acceptance (``acceptance_counts``): ``a = 1 +`` the leading accepted drafts, each with
probability ``alpha`` (a truncated geometric; ``alpha = 0.8`` at ``K = 4`` gives a mean of 2.95).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pmll_lab import _checks
from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal, errors
from pmll_lab.harness.registry import Family, add_family
from pmll_lab.ops.carry.ring import RING_LENGTHS
from pmll_lab.ops.gdn.checks import MAX_ROWS
from pmll_lab.peers import fused_gating
from pmll_lab.reference import carry as ref_carry
from pmll_lab.tolerances import STEP_STATE_TOL, STEP_TOL


def acceptance_counts(steps: int, batch: int, rows: int, alpha: float, seed: int,
                      device=None) -> torch.Tensor:
    """``[steps, batch]`` int32 on ``device``: ``1 +`` leading accepted drafts of ``rows - 1``,
    each accepted with probability ``alpha``; drawn from a seeded generator on the device."""
    _checks.positive_int("steps", steps)
    _checks.positive_int("rows", rows)
    try:
        ok = not isinstance(alpha, bool) and 0.0 <= float(alpha) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"alpha: the per-draft acceptance probability, a number in [0, 1], got "
                         f"{alpha!r}")
    dev = DEVICE if device is None else torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    u = torch.rand(steps, batch, max(rows - 1, 1), generator=gen, device=dev)
    lead = (u < alpha).to(torch.int32).cumprod(-1).sum(-1) if rows > 1 else 0 * u[..., 0]
    return (1 + lead).to(torch.int32).contiguous()


@dataclass
class StepCase:
    """One configuration of the step family. Inputs are drawn on the CPU from ``seed``
    (bf16-representable gating parameters, so that a peer's bf16 cast of ``A_log`` and
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
    state_layout: str = "vk"
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


def fill_ring(ring, fill: int, seed: int) -> None:
    """``fill`` realistic rows in every slot's window of a ``GdnRing`` at a seeded random
    ``base``: unit keys, corrections N(0, 0.3^2), cumulative log decays of ``-softplus(N(0, 1))``
    steps; drawn on the CPU (the same rows on every device). For timing a verify at a given
    ring fill."""
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


def folds_when_full(capacity: int) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The fold rule of a window of ``capacity`` rows: a verify of ``K`` rows on ``fill``
    pending rows folds (writes back) when ``fill + K > capacity``; then ``fill = a``."""
    return lambda fill, K: fill + K > capacity


def folds_when_pending() -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The eager rule: every verify with pending rows writes the state back."""
    return lambda fill, K: fill > 0


class StepForm:
    """One implementation's ``N`` steps on its own copy of the case's state.

    ``step(i)`` runs step ``i`` and returns its outputs ``o [B, K, HV, vd]``; ``run()`` runs all
    ``N`` (graph-capturable: the timed unit). ``effective_state(b)``: the float64 K-major state
    ``[HV, kd, vd]`` that sequence ``b``'s slot stands for. ``folds_when(fill, K)``: the fold or
    write-back rule the cursors must follow (None: no cursor), audited in the check run against
    the accepted counts; ``full_resets``: a step that accepts all ``K`` rows leaves nothing
    pending (the speculative store); ``cursors()``: what a step advances, its cursors and its
    state pool (a timed graph replay must change at least one of them). ``bytes_held``: bytes
    held per sequence to roll back or replay."""

    def __init__(self, name: str, case: StepCase, step: Callable, effective_state: Callable,
                 bytes_held: int, *, folds_when: Callable | None = None,
                 cursors: Callable[[], list[torch.Tensor]] | None = None,
                 full_resets: bool = False):
        self.name, self.case = name, case
        self.full_resets = full_resets
        self._step, self._effective = step, effective_state
        self.bytes_held = int(bytes_held)
        self.folds_when = folds_when
        self._cursors = cursors
        self.o = None
        self.engaged, self.fills = [], []

    def step(self, i: int, collect: bool = False):
        """Step ``i``; with ``collect`` also record its folds/write-backs (``engaged == 2``) and
        the fill before it, per sequence (host syncs: the check run only)."""
        self.o, e, fill = self._step(i, collect)
        if collect:
            self.engaged.append(None if e is None else e.cpu())
            self.fills.append(None if fill is None else fill.cpu())
        return self.o

    def run(self):
        for i in range(self.case.steps):
            self.step(i)

    def outputs(self) -> list[torch.Tensor]:
        """What the timed unit writes (poisoned before a timed replay, which must rewrite it)."""
        return [self.o] if self.o is not None else []

    def cursors(self) -> list[torch.Tensor]:
        return self._cursors() if self._cursors else []

    def effective_state(self, b: int) -> torch.Tensor:
        return self._effective(b)

    def fold_frac(self) -> float:
        got = [float((e == 2).float().mean()) for e in self.engaged if e is not None]
        return sum(got) / len(got) if got else 0.0

    def mean_fill(self) -> float:
        got = [float(f.float().mean()) for f in self.fills if f is not None]
        return sum(got) / len(got) if got else 0.0


def cursor_audit(sf: StepForm) -> dict:
    """Replay ``sf.folds_when`` over the accepted counts of the check run and compare, per
    sequence and step, with the fills (pending rows before the verify) and folds the form
    reported: ``{"cursor_steps": n, "cursor_mismatches": m}`` (``m = 0``: the cursors advanced
    and folded as the acceptance process implies). Forms without a cursor give ``{}``."""
    if sf.folds_when is None or not sf.fills or sf.fills[0] is None:
        return {}
    acc = sf.case.tensors["accepted"].cpu().long()
    fill = torch.zeros_like(acc[0])
    bad = 0
    for i, (got_fill, got_e) in enumerate(zip(sf.fills, sf.engaged)):
        bad += int((got_fill.long() != fill).sum())
        fold = sf.folds_when(fill, sf.case.rows)
        if got_e is not None:
            bad += int(((got_e == 2) != fold).sum())
        fill = torch.where(fold, acc[i], fill + acc[i])
        if sf.full_resets:
            fill = torch.where(acc[i] == sf.case.rows, 0, fill)
    return {"cursor_steps": len(sf.fills), "cursor_mismatches": bad}


PLAIN: Callable[[StepCase], StepForm] | None = None
"""The family's plain decoding (``case -> StepForm``) every sequence of a non-exact form is
compared with; ``harness.step_forms`` sets it (``build_plain``) when it registers the forms, so
this module need not import that one (which imports this)."""


def _worst_seq(x: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """The largest per-sequence rel L2 of ``x`` against ``ref`` (``[B, ...]``; with ``rows
    [B]``, only the first ``rows[b]`` entries of dim 1 of sequence ``b`` count)."""
    x, ref = x.float(), ref.float()
    if rows is not None:
        keep = (torch.arange(x.shape[1], device=x.device)[None, :] < rows[:, None].to(x.device))
        keep = keep.reshape(*keep.shape, *([1] * (x.dim() - 2)))
        x, ref = x * keep, ref * keep
    diff = (x - ref).flatten(1).norm(dim=1)
    return float((diff / ref.flatten(1).norm(dim=1).clamp_min(1e-30)).max())


def check(sf: StepForm, case: StepCase, *, ref_seqs: int = 4, plain: Callable | None = None
          ) -> dict:
    """Run ``sf``'s steps without a graph and check them, every sequence of the batch:

    - the first ``ref_seqs`` sequences against float64 decoding of the accepted rows (their
      accepted counts must hold at least one rejection, else ``ValueError`` naming
      ``accepted``: a form that ignores the counts would pass): every step's accepted outputs
      and the final effective states (``errors["o"]``, ``errors["state"]``: worst step / slot,
      within ``STEP_TOL`` / ``STEP_STATE_TOL``);
    - every sequence against plain decoding of the same case on the device (``errors["o vs
      plain"]``, ``errors["state vs plain"]``: the worst sequence, same tolerances), so that a
      form that gets only the first sequences right fails; ``plain``: the exact
      implementation's own plain decoding (``Implementation.plain``), whose final states every
      sequence must also equal to the bit (``bitwise``); without it the family's
      (``PLAIN``: ``step_forms.build_plain``) is run;
    - the cursor audit (``cursor_audit``).

    ``facts``: ``fold_frac`` (folds or write-backs per verify), ``mean_fill`` (pending rows
    before a verify). Call it on a fresh ``build``."""
    t = case.tensors
    n = min(ref_seqs, case.batch)
    if not bool((t["accepted"][:, :n] < case.rows).any()):
        raise ValueError(
            f"accepted: every step of the {n} checked sequences accepted all K = {case.rows} "
            f"rows (alpha {case.alpha}, {case.steps} steps, seed {case.seed}), so no rejected "
            "draft would be checked; take more steps or a lower alpha")
    exact = plain is not None
    if plain is None:
        if PLAIN is None:
            raise RuntimeError("no plain decoding to check against: harness.step_forms sets "
                               "step.PLAIN when it is imported (harness.catalog imports it)")
        plain = PLAIN(case)
    sd = str(case.state_dtype).removeprefix("torch.")
    ref = t["state"][:].double().transpose(-1, -2).cpu()
    slots = t["slots"][:n].cpu()
    worst_o = worst_op = 0.0
    for i in range(case.steps):
        o = sf.step(i, collect=True)
        po = plain.step(i)
        acc_all = t["accepted"][i]
        worst_op = max(worst_op, _worst_seq(o, po, acc_all))
        r = case.rows_of(i)
        g, beta = fused_gating(r["A_log"].cpu(), r["a"][:n].cpu(), r["dt_bias"].cpu(),
                               r["b"][:n].cpu())
        rows = (r["q"][:n].cpu(), r["k"][:n].cpu(), r["v"][:n].cpu(), g, beta)
        o_ref = ref_carry.decode_tokens(ref.clone(), *rows, slots, scale=case.scale)
        acc = acc_all[:n].cpu()
        for b in range(n):
            a = int(acc[b])
            worst_o = max(worst_o, errors(o[b, :a].float().cpu(), o_ref[b, :a])["rel_l2"])
            ref_carry.decode_tokens(ref, *(x[b:b + 1, :a] for x in rows), slots[b:b + 1],
                                    scale=case.scale)
    worst_s = max(errors(sf.effective_state(b), ref[int(slots[b])])["rel_l2"] for b in range(n))
    states = torch.stack([sf.effective_state(b).float() for b in range(case.batch)])
    plain_states = torch.stack([plain.effective_state(b).float() for b in range(case.batch)])
    worst_sp = _worst_seq(states, plain_states)
    tol_o, tol_s = STEP_TOL[sd], STEP_STATE_TOL[sd]
    audit = cursor_audit(sf)
    errs = {"o": worst_o, "state": worst_s, "o vs plain": worst_op, "state vs plain": worst_sp}
    tol = {"o": tol_o, "state": tol_s, "o vs plain": tol_o, "state vs plain": tol_s}
    out = {"errors": errs, "tolerance": tol,
           "passed": all(errs[w] <= tol[w] for w in errs)
           and not audit.get("cursor_mismatches"),
           "facts": {"fold_frac": sf.fold_frac(), "mean_fill": sf.mean_fill(), **audit}}
    if exact:
        same = all(bitwise_equal(sf.effective_state(b), plain.effective_state(b))
                   for b in range(case.batch))
        out["bitwise"] = {"state vs plain decoding": same}
        out["passed"] = out["passed"] and same
    return out


def make_case(p: dict) -> StepCase:
    """A ``StepCase`` of a workload row (``B, K, HK, HV, head_dim, steps, alpha, state_dtype``;
    ``seed``, ``ring_length``, ``dtype`` optional), after ``check_point(p)``."""
    check_point(p)
    return StepCase(batch=int(p["B"]), rows=int(p["K"]), num_k_heads=int(p["HK"]),
                    num_v_heads=int(p["HV"]), head_dim=int(p["head_dim"]),
                    steps=int(p["steps"]), alpha=float(p["alpha"]),
                    dtype=getattr(torch, p.get("dtype", "bfloat16")),
                    state_dtype=getattr(torch, p["state_dtype"]), seed=int(p.get("seed", 0)),
                    ring_length=int(p.get("ring_length", 16)))


def check_point(p: dict) -> None:
    """``ValueError`` naming the axis for ``K`` above the verify kernels' ``MAX_ROWS`` (8), a
    ``ring_length`` outside ``RING_LENGTHS`` (8, 16, 32: the ring's window, which also bounds
    ``K``) or below 2, ``HV`` not a multiple of ``HK`` or ``alpha`` outside ``(0, 1)``: what
    no form of the step can run or the check cannot judge (it needs a rejected draft: with
    ``K = 1`` or ``alpha = 1`` none is), refused before any tensor is drawn (a sweep refuses it
    before any point runs)."""
    if int(p["K"]) > MAX_ROWS:
        raise ValueError(f"K: at most {MAX_ROWS} draft rows per verify, got {p['K']!r}")
    if int(p["K"]) < 2:
        raise ValueError(f"K: at least 2 rows per verify (one row has no draft to reject, and "
                         f"the check needs a rejected one), got {p['K']!r}")
    if int(p.get("ring_length", 16)) not in RING_LENGTHS:
        raise ValueError(f"ring_length: must be one of {RING_LENGTHS}, got {p['ring_length']!r}")
    if int(p["HV"]) % int(p["HK"]):
        raise ValueError(f"HV: must be a multiple of HK = {p['HK']}, got {p['HV']!r}")
    try:
        alpha = float(p["alpha"])
    except (TypeError, ValueError):
        raise ValueError(f"alpha: the per-draft acceptance probability, a number in (0, 1), got "
                         f"{p['alpha']!r}") from None
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: the per-draft acceptance probability lies in (0, 1) (at 1 no "
                         f"draft is rejected, and the check needs one), got {p['alpha']!r}")


FAMILY = add_family(Family(
    name="gdn_step", label="the whole speculative step (verify + accept/commit/restore)",
    axes=("B", "K", "HK", "HV", "head_dim", "steps", "alpha", "state_dtype", "ring_length",
          "seed", "dtype"),
    make_case=make_case, check=check, metric="step_us", exact_plain=True,
    optional=("seed", "dtype", "ring_length"),
    doc="SPEC §3: per step of K draft rows, what a serving engine pays"))
