"""The ``conv_step`` family: the causal conv twin's speculative step (SPEC §3c), beside GDN's.

Its carry (``conv_carry_verify`` lazy + ``carry_accept``) and its chain with window snapshots +
the restore, on Qwen3-Next's fused ``qkv`` channels (``dim = 2 HK kd + HV vd``, conv width 4).
Both must equal ``conv_update`` per accepted row to the bit (outputs and final windows).
"""

from __future__ import annotations

import torch

from pmll_lab.backend import DEVICE
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import GDN_CARRY_CAP, carry_accept
from pmll_lab.conv import (ConvCarry, conv_carry_flush, conv_carry_verify, conv_chain,
                           conv_update)
from pmll_lab.harness.registry import Family, Implementation, add_family, register
from pmll_lab.harness.step import StepCase, make_case
from pmll_lab.ops.gdn.restore import gdn_snapshot_restore

D_CONV = 4


def conv_inputs(case: StepCase) -> dict:
    """The conv twin's inputs for ``case``: per step ``x [B, K, dim]``, ``weight [dim, 4]``, a
    window pool ``[B, dim, 3]``, all in ``case.dtype``; drawn on the CPU from ``seed + 2``."""
    gen = torch.Generator().manual_seed(int(case.seed) + 2)
    HK, HV, d = case.num_k_heads, case.num_v_heads, case.head_dim
    dim = 2 * HK * d + HV * d
    t = dict(x=torch.randn(case.steps, case.batch, case.rows, dim, generator=gen),
             weight=torch.randn(dim, D_CONV, generator=gen) * 0.5,
             window=torch.randn(case.batch, dim, D_CONV - 1, generator=gen))
    out = {n: v.to(case.dtype).to(DEVICE) for n, v in t.items()}
    out.update(qk_channels=2 * HK * d, head_dim=d)
    return out


class ConvStep:
    """One conv form's ``N`` steps on a fresh copy of the window pool: ``step(i) -> y``,
    ``run()`` all of them (graph-capturable), ``window`` and ``carry`` (None for the chain)."""

    def __init__(self, case: StepCase, lazy_carry: bool):
        self.case = case
        c = self.inputs = conv_inputs(case)
        self.window = c["window"].clone()
        slots, acc = case.tensors["slots"], case.tensors["accepted"]
        kw = dict(qk_channels=c["qk_channels"], head_dim=c["head_dim"])
        self.y = None
        if lazy_carry:
            self.carry = ConvCarry.empty(case.batch, self.window.shape[1], cap=GDN_CARRY_CAP,
                                         dtype=case.dtype)

            def step(i):
                y, e = conv_carry_verify(self.window, self.carry, c["x"][i], c["weight"],
                                         slot_tab=slots, lazy=True, **kw)
                carry_accept(self.carry, slots, e, acc[i])
                return y
            self.bytes_held = GDN_CARRY_CAP * self.window.shape[1] * self.window.element_size() + 4
        else:
            self.carry = None
            inter = torch.empty(case.batch, case.rows - 1, *self.window.shape[1:],
                                dtype=self.window.dtype, device=self.window.device)

            def step(i):
                y = conv_chain(self.window, c["x"][i], c["weight"], state_indices=slots,
                               intermediate=inter, **kw)
                gdn_snapshot_restore(self.window, inter, slots, acc[i], last_in_place=True)
                return y
            self.bytes_held = inter[0].numel() * inter.element_size()
        self._step = step

    def step(self, i: int):
        self.y = self._step(i)
        return self.y

    def run(self):
        for i in range(self.case.steps):
            self.step(i)

    def outputs(self):
        return [self.y] if self.y is not None else []

    def cursors(self):
        return [self.carry.pend] if self.carry is not None else []


def check(form: ConvStep, case: StepCase, plain=None) -> dict:
    """Every accepted output row and the final windows (the carry's pending inputs shifted in)
    against ``conv_update`` per accepted row, bitwise."""
    c = form.inputs
    ref, slots = c["window"].clone(), case.tensors["slots"]
    ok = True
    for i in range(case.steps):
        y = form.step(i)
        acc = case.tensors["accepted"][i]
        for row in range(case.rows):
            live = torch.where(acc > row, slots, -1).to(torch.int32)
            yr = conv_update(ref, c["x"][i][:, row], c["weight"], state_indices=live,
                             qk_channels=c["qk_channels"], head_dim=c["head_dim"])
            m = (acc > row)
            ok &= bitwise_equal(y[:, row][m], yr[m])
    if form.carry is not None:
        conv_carry_flush([form.window], [form.carry], slots)
    ok = bool(ok and bitwise_equal(form.window, ref))
    return {"errors": {}, "tolerance": 0.0, "passed": ok,
            "bitwise": {"outputs and windows vs conv_update": ok}}


FAMILY = add_family(Family(
    name="conv_step", label="the conv twin's speculative step", axes=(
        "B", "K", "HK", "HV", "head_dim", "steps", "alpha", "state_dtype", "seed", "dtype",
        "ring_length"),
    make_case=make_case, check=check, metric="step_us",
    optional=("seed", "dtype", "ring_length"),
    doc="SPEC §3c: the causal conv's window carried like the GDN state"))
CARRY_LAZY = register(Implementation(
    name="conv_carry_lazy", family="conv_step", label="conv twin: carry, lazy", exact=True,
    build=lambda c: ConvStep(c, lazy_carry=True), style={"color": "#1f77b4"},
    doc="bitwise conv_update per accepted row"))
CHAIN_RESTORE = register(Implementation(
    name="conv_chain_restore", family="conv_step", label="conv twin: chain + restore",
    exact=True, build=lambda c: ConvStep(c, lazy_carry=False), style={"color": "#2ca02c"},
    doc="window snapshots + the restore; bitwise conv_update"))
