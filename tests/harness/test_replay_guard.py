"""The CUDA-graph replay guard (``harness.runner.replay_guard``) on stand-in runs, on the CPU:
it refuses a replay that leaves an output stale or moves nothing, and passes a replay that runs
the steps even when their state sits at a periodic fixed point (the B = 1 step case on the GPU:
the same 16 steps fed again map the state onto itself)."""

import pytest
import torch

from pmll_lab.harness.runner import replay_guard


class FixedPointRun:
    """A stand-in step loop: ``s <- 0.5 s + c`` per step (fixed point ``2c``), a cursor that
    advances by ``accepted`` modulo 4 (back where it started after 4 steps), and an output."""

    def __init__(self, seed: int, steps: int = 4, at_fixed_point: bool = True):
        gen = torch.Generator().manual_seed(seed)
        self.c = torch.randn(3, 5, generator=gen, dtype=torch.float64)
        self.state = 2 * self.c.clone() if at_fixed_point else torch.randn(3, 5, generator=gen,
                                                                            dtype=torch.float64)
        self.cursor = torch.zeros(3, dtype=torch.int32)
        self.o = torch.empty(3, 5, dtype=torch.float64)
        self.steps = steps

    def run(self):
        for _ in range(self.steps):
            self.state.mul_(0.5).add_(self.c)
            self.cursor.add_(1).remainder_(4)
            self.o.copy_(self.state * 3)

    def outputs(self):
        return [self.o]

    def cursors(self):
        return [self.cursor, self.state]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_guard_passes_a_replay_at_a_periodic_fixed_point(seed):
    run = FixedPointRun(seed)
    before = run.state.clone()
    run.run()
    assert torch.equal(run.state, before)  # the trap: a replay maps this state onto itself
    proof = replay_guard(run)(run.run)
    assert proof == {"outputs_rewritten": 1, "cursors_advanced": True}
    # the guard halved the state and the replay moved it back towards 2c: values, not a stub
    assert torch.allclose(run.state, 2 * run.c, atol=0.5 ** 4 * run.c.abs().max() + 1e-12)
    assert torch.isfinite(run.o).all()


def test_guard_refuses_a_replay_that_moves_nothing():
    run = FixedPointRun(3, at_fixed_point=False)
    run.run()

    def rewrite_only():  # rewrites the output, advances no cursor, writes no state
        run.o.copy_(torch.randn(3, 5, dtype=torch.float64))

    with pytest.raises(RuntimeError, match="advanced neither cursor nor state"):
        replay_guard(run)(rewrite_only)


def test_guard_refuses_a_replay_that_leaves_the_output_stale():
    run = FixedPointRun(4, at_fixed_point=False)

    def state_only():
        run.state.mul_(0.5).add_(run.c)
        run.cursor.add_(1)

    with pytest.raises(RuntimeError, match=r"did not rewrite output\(s\) \[0\]"):
        replay_guard(run)(state_only)
