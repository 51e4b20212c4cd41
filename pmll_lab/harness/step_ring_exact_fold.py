"""The ring form with an exact fold (``ring_exact_fold``): our tensor-core ring verify for the
outputs, and at each fold the committed window's raw rows replayed into the checkpoint by the
decode kernel, so the stored state is plain decoding's to the bit after every fold.

Why: SGLang 0.5.23's ReplaySSM ring folds its window this way ("closed loop": the state never
drifts, only the outputs inside a window carry the ring's tolerance); our ring folds its
corrections on tensor cores and its fp32 state drifts up to 2.3e-4 over 1390 steps (run
`h100-2026-12-06`). This form measures what the exact fold costs per step and buys in drift.

Per step, on the device with no host sync (graph-capturable): slots whose window would fold in
this verify (``len + K > R``) replay their ``len`` raw rows (``k``, ``v``, ``a``, ``b`` as the
step received them) with ``gdn_decode``, one launch per window row with the other lanes
padding (a first cut: ``R`` launches per step; a fused fold would take one), and their window
is emptied (``len = 0``); then the ring verify (which finds no window to fold) and its commit;
the ``K`` raw rows are kept at ``len..len + K - 1`` of the slot's raw window (rows past the
accepted ones are overwritten by the next step's). The effective state of a sequence is its
checkpoint with its window's raw rows replayed by the same kernel on a copy: bitwise plain
decoding of every accepted token (the check compares it), while the outputs are the ring's.
"""

from __future__ import annotations

import torch

from pmll_lab import sizes
from pmll_lab.carry import GdnRing, gdn_ring_verify, ring_accept
from pmll_lab.gdn import gdn_decode
from pmll_lab.harness.registry import Implementation, register
from pmll_lab.harness.step import StepCase, StepForm, folds_when_full
from pmll_lab.harness.step_forms import build_plain, dims, fresh, kv64, ring_supports

NAME = "ring_exact_fold"


class RawWindow:
    """Each slot's committed raw rows since its last fold, as the step received them: ``k [S,
    R + K, HK, kd]``, ``v [S, R + K, HV, vd]``, ``a, b [S, R + K, HV]`` in the inputs' dtypes
    (``K`` spare rows: the step writes all ``K`` rows before the accepted count is known)."""

    def __init__(self, case: StepCase):
        t = case.tensors
        S, n = t["state"].shape[0], case.ring_length + case.rows
        self.k, self.v, self.a, self.b = (t[x].new_zeros(S, n, *t[x].shape[3:]) for x in "kvab")
        self.rows = case.rows

    def keep(self, slots: torch.Tensor, start: torch.Tensor, r: dict) -> None:
        """Write the step's ``K`` rows of each sequence at ``start [B] .. start + K - 1`` of its
        slot's window (static shapes: capturable)."""
        s = slots.long()[:, None].expand(-1, self.rows)
        j = start.long()[:, None] + torch.arange(self.rows, device=start.device)
        for dst, src in ((self.k, r["k"]), (self.v, r["v"]), (self.a, r["a"]), (self.b, r["b"])):
            dst[s, j] = src

    def replay(self, state, slots: torch.Tensor, count: torch.Tensor, case: StepCase,
               length: int) -> None:
        """Decode window rows ``0 .. count[b] - 1`` of each sequence's slot into ``state``
        (``count`` 0: that lane is padding in every launch), ``length`` launches."""
        r0 = case.rows_of(0)
        s = slots.long()
        for j in range(length):
            live = torch.where(count > j, slots, -1).to(torch.int32)
            k = self.k[s, j]
            gdn_decode(state, k, k, self.v[s, j], A_log=r0["A_log"], a=self.a[s, j],
                       dt_bias=r0["dt_bias"], b=self.b[s, j], state_indices=live,
                       state_layout="vk", scale=case.scale)

    def bytes_per_slot(self) -> int:
        per_row = sum(x[0, 0].numel() * x.element_size() for x in (self.k, self.v, self.a,
                                                                   self.b))
        return per_row * self.k.shape[1]


def build_ring_exact_fold(case: StepCase, name: str = NAME) -> StepForm:
    """``gdn_ring_verify`` + ``ring_accept`` with the window folded by decoding its raw rows
    (module docstring); ring rows in the state's dtype, V-major pool."""
    state, slots, acc = fresh(case)
    d, R, K = case.head_dim, case.ring_length, case.rows
    ring = GdnRing.empty(case.batch, case.num_k_heads, case.num_v_heads, d, d, length=R,
                         dtype=case.state_dtype)
    raw = RawWindow(case)
    lanes = slots.long()

    def step(i, collect):
        r = case.rows_of(i)
        fill = ring.len[lanes].clone()
        due = fill + K > R
        raw.replay(state, slots, torch.where(due, fill, 0), case, R)
        ring.len[lanes] = torch.where(due, 0, fill)
        start = ring.len[lanes].clone()
        o, e = gdn_ring_verify(state, ring, **r, slot_tab=slots, scale=case.scale)
        ring_accept(ring, slots, e, acc[i], rows=K)
        raw.keep(slots, start, r)
        engaged = torch.where(due, 2, e) if collect else None
        return o, engaged, fill if collect else None

    def effective(b):
        folded, one = state.clone(), slots[b:b + 1].contiguous()
        raw.replay(folded, one, ring.len[one.long()], case, R)
        return kv64(folded, slots)(b)

    return StepForm(name, case, step, effective, ring.bytes_per_slot + raw.bytes_per_slot(),
                    folds_when=folds_when_full(R),
                    cursors=lambda: [ring.len, ring.base, state])


def _bytes(c: StepCase, f: dict) -> int:
    mean_accept = float(c.tensors["accepted"].float().mean())
    raw_row = sizes.raw_row_bytes(c.num_k_heads, c.num_v_heads, c.head_dim, c.head_dim, c.dtype)
    return sizes.ring_step_bytes(**dims(c), fold_frac=f["fold_frac"],
                                 mean_fill=f["mean_fill"]) + int(raw_row * (c.rows + mean_accept))


register(Implementation(
    name=NAME, family="gdn_step", exact=True, label="carry ring, exact fold",
    build=build_ring_exact_fold, plain=build_plain, style={"color": "#9edae5"}, bytes=_bytes,
    supports=ring_supports,
    drift=("bfloat16", "float32"),
    doc="SPEC §3d's ring for the outputs; its window folded by decoding the raw rows, so the "
        "state is plain decoding's to the bit (SGLang's closed-loop fold, on our ring)"))
