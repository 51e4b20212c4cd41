"""The one table of targets, keyed by registry names (``pmll_lab.harness``): the speculative
step's, and the GDN decode's against FlashInfer's (the kernels notebook's headline).

Each row is a ``targets.Target`` over the step sweeps' rows (``metric="step_us"``, ``K = 4``,
one headline row per ``B``) with the notebooks whose headline shows it (``reports``; carry_step,
the step's own notebook, shows every one); a report takes its rows with
``for_report(notebook)``. ``bound=None``: the figure is reported, not judged.
Every target compares rows of one run on one device; a peer's row is the fastest of its
versions in that run.
"""

from __future__ import annotations

from pmll_lab.experiments.targets import Target

ROOF, PROTO, STEP, KERNELS = "roofline", "carry_protocol", "carry_step", "kernels"
B_MAIN = (64, 128)
B_ALL = (1, 8, 64, 128, 256)
QWEN3_NEXT = {"HK": 16, "HV": 32, "head_dim": 128}
"""The GDN layer's shape the decode targets are judged at (a grid may span others)."""


def step_target(text: str, ours: str, peer: str, bound: float | None, *, reports: tuple,
                state_dtype: str = "bfloat16", Bs=B_MAIN, ours_dtype: str | None = None,
                rings: bool = False) -> Target:
    """A per-step target (``step_us`` at ``K = 4``, one row per ``B``): implementation ``ours``
    against ``peer`` at ``state_dtype`` (ours at ``ours_dtype`` where given). ``rings``: both
    sides are ring forms, each ring length both ran a cell of its own (the two sides matched,
    every cell judged, the worst shown); otherwise each side's fastest row counts (a ring form
    at its best ring length against a form that has none)."""
    return Target(text, {"form": ours, "state_dtype": ours_dtype or state_dtype},
                  {"form": peer, "state_dtype": state_dtype}, bound,
                  where={"K": 4, "B": list(Bs)}, per=("B",),
                  over=("ring_length",) if rings else (), metric="step_us",
                  reports=tuple(dict.fromkeys(reports + (STEP,))))


F32 = "float32"
TARGETS = (
    # the ring form against the ReplaySSM rings
    step_target("ring step <= 0.9x FlashInfer's ReplaySSM step, bf16 state", "ring",
                "flashinfer_replayssm", 0.9, reports=(ROOF, STEP), rings=True),
    step_target("ring step <= 0.8x SGLang's ReplaySSM ring step, bf16 state", "ring",
                "sglang_replayssm", 0.8, reports=(ROOF, STEP), rings=True),
    step_target("B = 1, 8: ring step <= FlashInfer's ReplaySSM step, bf16 state", "ring",
                "flashinfer_replayssm", 1.0, Bs=(1, 8), reports=(ROOF, STEP), rings=True),
    step_target("B = 1, 8: ring step <= SGLang's ReplaySSM ring step, bf16 state", "ring",
                "sglang_replayssm", 1.0, Bs=(1, 8), reports=(STEP,), rings=True),
    step_target("ring step, fp32 state, <= 1.5x the bf16-state ring step", "ring", "ring", 1.5,
                ours_dtype=F32, reports=(STEP,), rings=True),
    # the exact carried state against the field's exact one and the snapshot baseline
    step_target("exact lazy step <= 0.5x SGLang's fold-every-commit step, fp32 state",
                "exact_lazy", "sglang_exact_fold", 0.5, state_dtype=F32, Bs=B_ALL,
                reports=(ROOF, PROTO)),
    step_target("exact lazy step, bf16 state, <= 0.8x SGLang's fold-every-commit step on its "
                "bf16 pool", "exact_lazy", "sglang_exact_fold", 0.8, Bs=B_ALL,
                reports=(PROTO,)),
    step_target("exact lazy step, bf16 state, <= 0.8x the same step with an fp32 state",
                "exact_lazy", "exact_lazy", 0.8, state_dtype=F32, ours_dtype="bfloat16",
                reports=(PROTO,)),
    step_target("exact lazy step <= 2.5x the ring step, bf16 state", "exact_lazy", "ring", 2.5,
                reports=(PROTO, STEP)),
    # the exact form with the speculative store (the full-acceptance state in a spare slot)
    step_target("exact step with the speculative store <= 0.5x SGLang's fold-every-commit "
                "step, fp32 state", "exact_spec", "sglang_exact_fold", 0.5, state_dtype=F32,
                Bs=B_ALL, reports=(PROTO,)),
    step_target("exact step with the speculative store, bf16 state, <= 0.8x SGLang's "
                "fold-every-commit step on its bf16 pool", "exact_spec", "sglang_exact_fold",
                0.8, Bs=B_ALL, reports=(PROTO,)),
    step_target("exact step with the speculative store, bf16 state, <= 0.8x the same step with "
                "an fp32 state", "exact_spec", "exact_spec", 0.8, state_dtype=F32,
                ours_dtype="bfloat16", reports=(PROTO,)),
    step_target("exact step with the speculative store <= 2.5x the ring step, bf16 state",
                "exact_spec", "ring", 2.5, reports=(PROTO,)),
    step_target("exact lazy step <= 0.4x FlashInfer's snapshot step (mtp + restore), fp32 state",
                "exact_lazy", "flashinfer_snapshot_restore", 0.4, state_dtype=F32,
                reports=(ROOF, PROTO)),
    step_target("exact lazy step <= 0.4x FlashInfer's snapshot step (mtp + restore), bf16 state",
                "exact_lazy", "flashinfer_snapshot_restore", 0.4, reports=(PROTO,)),
    step_target("chain + snapshots + restore step <= FlashInfer mtp + snapshots + restore, fp32 "
                "state", "chain_restore", "flashinfer_snapshot_restore", 1.0, state_dtype=F32,
                reports=(ROOF,)),
    step_target("chain + snapshots + restore step <= FlashInfer mtp + snapshots + restore, bf16 "
                "state", "chain_restore", "flashinfer_snapshot_restore", 1.0, reports=(ROOF,)),
    step_target("CUDA twin's exact lazy step <= 1.5x FlashInfer's ReplaySSM step, bf16 state",
                "exact_lazy_cuda", "flashinfer_replayssm", 1.5, reports=(PROTO, STEP)),
    step_target("CUDA twin's exact lazy step <= 0.5x the Triton exact lazy step, bf16 state",
                "exact_lazy_cuda", "exact_lazy", 0.5, reports=(PROTO, STEP)),
    # reported, not judged
    step_target("exact lazy step against FlashInfer's ReplaySSM step, bf16 state", "exact_lazy",
                "flashinfer_replayssm", None, reports=(ROOF, PROTO, STEP)),
    step_target("exact eager step against SGLang's fold-every-commit step, fp32 state",
                "exact_eager", "sglang_exact_fold", None, state_dtype=F32, Bs=B_ALL,
                reports=(PROTO,)),
    step_target("exact lazy step against our chain + snapshots + restore, fp32 state",
                "exact_lazy", "chain_restore", None, state_dtype=F32, reports=(PROTO,)),
    step_target("exact lazy step against eager, fp32 state", "exact_lazy", "exact_eager", None,
                state_dtype=F32, reports=(PROTO,)),
    step_target("exact step with the speculative store against exact lazy, bf16 state",
                "exact_spec", "exact_lazy", None, Bs=B_ALL, reports=(PROTO,)),
    step_target("exact step with the speculative store against exact lazy, fp32 state",
                "exact_spec", "exact_lazy", None, state_dtype=F32, Bs=B_ALL, reports=(PROTO,)),
    step_target("ring step against FlashInfer's snapshot step (mtp + restore), bf16 state",
                "ring", "flashinfer_snapshot_restore", None, reports=(PROTO,)),
    step_target("ring step against our chain + snapshots + restore, bf16 state", "ring",
                "chain_restore", None, reports=(PROTO,)),
    step_target("CUDA twin's exact lazy step against the Triton one, fp32 state",
                "exact_lazy_cuda", "exact_lazy", None, state_dtype=F32, reports=(PROTO,)),
    step_target("FlashInfer's ReplaySSM step against its own snapshot verify + restore",
                "flashinfer_replayssm", "flashinfer_snapshot_restore", None, reports=(STEP,)),
    step_target("SGLang's ReplaySSM ring step against its fold-every-commit step, bf16 state",
                "sglang_replayssm", "sglang_exact_fold", None, reports=(STEP,)),
    # one GDN decode (gdn_decode rows: time_us of one launch), bf16 state, Qwen3-Next's shape
    Target("bf16-state decode <= FlashInfer's decode", "decode", "flashinfer_decode", 1.0,
           where={**QWEN3_NEXT, "state_dtype": "bfloat16", "B": list(B_ALL)}, per=("B",),
           reports=(KERNELS,)),
    Target("bf16-state decode >= 0.85 of the copy ceiling from B = 64", "decode", None, 0.85,
           kind="frac", where={**QWEN3_NEXT, "state_dtype": "bfloat16", "B": [64, 128, 256]},
           per=("B",), reports=(KERNELS,)),
)
"""Every target; a new target or report is one more row or tag."""

SETS = {ROOF: "The speculative step at Qwen3-Next's shape (verify + accept/commit/restore, K=4) "
              "against FlashInfer and SGLang",
        PROTO: "The carried state's whole speculative step against the snapshot chain and the "
               "field's exact carried state",
        STEP: "The whole speculative step",
        KERNELS: "One GDN decode against FlashInfer's"}
"""The headline's title per report."""


def for_report(notebook: str) -> tuple[Target, ...]:
    """The targets ``notebook``'s headline shows (``ValueError`` naming ``notebook`` for a
    report no target names)."""
    if notebook not in SETS:
        raise ValueError(f"notebook: no step targets for {notebook!r} ({', '.join(SETS)})")
    return tuple(t for t in TARGETS if notebook in t.reports)
