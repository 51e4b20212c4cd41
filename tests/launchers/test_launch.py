"""Launch plans (``pmll_lab.ops.launch.LaunchPlan``: the lean small-batch path).

A plan binds one launch to fixed buffers; each call runs the kernel on whatever the buffers hold
then. On the interpreter every call goes through Triton's normal path; on a GPU calls after the
first go straight to the compiled kernel (checked bitwise against the plain launchers in the
roofline notebook's B=1 rows). Here: the plans give the plain launchers' results bit for bit
over several steps whose inputs are rewritten in place, return the same output tensors each
call, check their arguments once (``ValueError`` naming the argument), and handle ``B = 0``.
"""

from __future__ import annotations

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.bench import bitwise_equal
from pmll_lab.carry import GdnCarry, carry_accept, gdn_carry_verify, gdn_carry_verify_plan
from pmll_lab.gdn import gdn_chain, gdn_chain_plan, gdn_decode, gdn_decode_plan
from pmll_lab.inputs import gdn_inputs
from pmll_lab.ops.launch import LaunchPlan

ROWS = ("q", "k", "v", "g", "beta")


def _refill(dst, seed):
    """Write new seeded inputs into ``dst``'s row tensors in place (a decode step's inputs)."""
    B, K = dst["q"].shape[:2] if dst["q"].dim() == 4 else (dst["q"].shape[0], None)
    HK, kd = dst["q"].shape[-2:]
    HV, vd = dst["v"].shape[-2:]
    new = gdn_inputs(seed, B, HK, HV, kd, vd, rows=K, dtype=dst["q"].dtype, state_layout="kv")
    for n in ROWS:
        dst[n].copy_(new[n])


def test_decode_plan_matches_gdn_decode_over_steps():
    x = gdn_inputs(300, 3, 1, 2, 32, 16, slots=5, dtype=torch.bfloat16, state_layout="kv")
    s_plan, s_ref = x["state"].clone(), x["state"].clone()
    rows = {n: x[n].clone() for n in ROWS}
    plan = gdn_decode_plan(s_plan, *(rows[n] for n in ROWS), state_indices=x["state_indices"],
                           validate=True, state_layout="kv")
    assert isinstance(plan, LaunchPlan)
    for step in range(3):
        _refill(rows, 310 + step)
        o = plan()
        ref = gdn_decode(s_ref, *(rows[n] for n in ROWS), state_indices=x["state_indices"],
                         state_layout="kv")
        assert o is plan.outputs
        assert bitwise_equal(o, ref) and bitwise_equal(s_plan, s_ref), f"step {step}"


def test_decode_plan_fp32_outputs_from_bf16_inputs():
    x = gdn_inputs(305, 2, 1, 2, 16, 16, slots=3, dtype=torch.bfloat16, state_layout="kv")
    s_plan, s_ref = x["state"].clone(), x["state"].clone()
    o = gdn_decode_plan(s_plan, *(x[n] for n in ROWS), out_dtype=torch.float32, state_layout="kv")()
    ref = gdn_decode(s_ref, *(x[n] for n in ROWS), out_dtype=torch.float32, state_layout="kv")
    assert o.dtype == torch.float32 and bitwise_equal(o, ref) and bitwise_equal(s_plan, s_ref)
    with pytest.raises(ValueError, match="^out:"):
        gdn_decode_plan(x["state"], *(x[n] for n in ROWS), out_dtype=torch.float32,
                        out=torch.empty(2, 2, 16, dtype=torch.bfloat16), state_layout="kv")


def test_chain_plan_matches_gdn_chain_with_snapshots():
    x = gdn_inputs(301, 2, 1, 2, 16, 32, rows=3, slots=4, dtype=torch.float32, state_layout="kv")
    s_plan, s_ref = x["state"].clone(), x["state"].clone()
    inter_p = torch.full((2, 2, 2, 16, 32), float("nan"))
    inter_r = inter_p.clone()
    out = torch.empty(2, 3, 2, 32)
    plan = gdn_chain_plan(s_plan, *(x[n] for n in ROWS), state_indices=x["state_indices"],
                          intermediate=inter_p, out=out, state_layout="kv")
    o = plan()
    ref = gdn_chain(s_ref, *(x[n] for n in ROWS), state_indices=x["state_indices"],
                    intermediate=inter_r, state_layout="kv")
    assert o is out
    for a, b in ((o, ref), (s_plan, s_ref), (inter_p, inter_r)):
        assert bitwise_equal(a, b)


@pytest.mark.parametrize("form", ["exact"])
def test_carry_verify_plan_matches_over_a_protocol_run(form):
    """Three verifies with accepts in between (the last writes back): the plan, whose rows,
    ``pend`` and slots are updated in place, equals ``gdn_carry_verify`` bit for bit."""
    B, HK, HV, kd, vd, K = 3, 1, 2, 32, 16, 3
    x = gdn_inputs(302, B, HK, HV, kd, vd, rows=K, slots=5, dtype=torch.bfloat16, state_layout="kv")
    states = [x["state"].clone(), x["state"].clone()]
    carries = [GdnCarry.empty(5, HV, kd, vd,
                              state_layout="kv"), GdnCarry.empty(5, HV, kd, vd, state_layout="kv")]
    rows = {n: x[n].clone() for n in ROWS}
    plan = gdn_carry_verify_plan(states[0], carries[0], *(rows[n] for n in ROWS),
                                 slot_tab=x["state_indices"], form=form, lazy=True,
                                 state_layout="kv")
    engaged_seen = []
    for step, acc in enumerate((3, 3, 1)):
        _refill(rows, 320 + step)
        o, e = plan()
        ro, re = gdn_carry_verify(states[1], carries[1], *(rows[n] for n in ROWS),
                                  slot_tab=x["state_indices"], form=form, lazy=True,
                                  state_layout="kv")
        assert (o, e) == plan.outputs
        for a, b in ((o, ro), (e, re), (states[0], states[1]), (carries[0].buf, carries[1].buf)):
            assert bitwise_equal(a, b), f"step {step}"
        engaged_seen += e.tolist()
        for c in carries:
            carry_accept(c, x["state_indices"], e, [acc] * B)
    assert 2 in engaged_seen and 1 in engaged_seen, "the run must cover a write-back and none"


def test_plans_check_arguments_once_and_handle_empty_batches():
    x = gdn_inputs(303, 2, 1, 2, 16, 16, rows=2, slots=3, dtype=torch.float32, state_layout="kv")
    with pytest.raises(ValueError, match="^out:"):
        gdn_chain_plan(x["state"], *(x[n] for n in ROWS), out=torch.empty(2, 2, 2, 8),
                       state_layout="kv")
    with pytest.raises(ValueError, match="^form:"):
        gdn_carry_verify_plan(x["state"], GdnCarry.empty(3, 2, 16, 16,
                                                         state_layout="kv"), *(x[n] for n in ROWS),
                              slot_tab=x["state_indices"], form="nope", state_layout="kv")
    with pytest.raises(ValueError, match="^slot_tab:"):
        gdn_carry_verify_plan(x["state"], GdnCarry.empty(3, 2, 16, 16,
                                                         state_layout="kv"), *(x[n] for n in ROWS),
                              slot_tab=x["state_indices"].float(), state_layout="kv")
    empty = {n: x[n][:0] for n in ROWS}
    o, e = gdn_carry_verify_plan(x["state"], GdnCarry.empty(3, 2, 16, 16, state_layout="kv"),
                                 *(empty[n] for n in ROWS),
                                 slot_tab=x["state_indices"][:0], state_layout="kv")()
    assert o.shape == (0, 2, 2, 16) and e.shape == (0,)
    with pytest.raises(ValueError, match="^kwargs:"):
        from pmll_lab.ops.gdn.decode import gdn_rows_kernel
        LaunchPlan(gdn_rows_kernel, (1,), (), {})


def test_direct_path_only_without_launch_hooks():
    """The direct path skips Triton's launch hooks, so it is taken only when none is registered:
    Triton 3.6 keeps them as (normally empty) ``HookChain`` objects, which must not count as
    hooks (the H200 run of 2026-11-29 found every plan call on Triton's slow path because they
    did), while a registered hook must."""
    from triton import knobs

    from pmll_lab.ops import launch

    assert launch.no_launch_hooks()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not launch.no_launch_hooks()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert launch.no_launch_hooks()


def test_direct_call_passes_every_parameter_in_order():
    """The direct path (GPU only) hands the compiled kernel's launcher the grid, the stream, the
    function, the packed metadata, no launch metadata or hooks, then every kernel parameter in
    declaration order (positional arguments, then the constexprs by name), as Triton's own
    ``JITFunction.run`` does. Checked here with a stand-in compiled kernel."""
    from pmll_lab.ops.gdn import decode as D

    x = gdn_inputs(304, 2, 1, 2, 16, 16, slots=3, dtype=torch.float32, state_layout="kv")
    plan = gdn_decode_plan(x["state"], *(x[n] for n in ROWS), state_indices=x["state_indices"],
                           state_layout="kv")
    calls = []

    class Compiled:
        function, packed_metadata = object(), object()

        def run(self, *a):
            calls.append(a)

    comp = Compiled()
    plan._compiled, plan._device_index = comp, 0
    plan._current_device = lambda: 0
    plan._get_stream = lambda device: ("stream", device)
    assert plan() is plan.outputs
    (got,) = calls
    names = D.gdn_rows_kernel.arg_names
    want_bound = tuple(plan.args) + tuple(plan.kwargs[n] for n in names[len(plan.args):])
    assert len(want_bound) == len(names)
    assert got == (*plan.grid, ("stream", 0), comp.function, comp.packed_metadata, None, None,
                   None, *want_bound)
    assert plan.kwargs["KD"] == 16 and "num_warps" in plan.kwargs   # options are not parameters
    # another device current: Triton's own path (here the interpreter), not the stand-in
    plan._current_device = lambda: 1
    plan()
    assert len(calls) == 1
