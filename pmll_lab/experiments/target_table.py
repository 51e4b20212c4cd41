"""The one table of targets, keyed by registry names (``pmll_lab.harness``) and the notebooks'
kernel names: every report's targets, one row each.

Each row is a ``targets.Target`` with the reports that show it (``reports``): a notebook's
headline (``roofline``, ``carry_protocol``, ``carry_step``: the speculative step's, over the
step sweeps' rows, ``metric="step_us"``, ``K = 4``, one headline row per ``B``; carry_step, the
step's own notebook, shows every step target; ``kernels``: the GDN decode's against
FlashInfer's; ``gdn_verify``, ``gdn_conv``, ``pmll_ring``, ``pmll_attention``,
``spec_decode``) or the detail under a headline (``roofline:launches``,
``carry_protocol:launches``: single launches). A report takes its rows with
``for_report(name)`` and its title from ``SETS``. ``bound=None``: the figure is reported, not
judged. Every target compares rows of one run on one device; a peer's row is the fastest of its
versions in that run.
"""

from __future__ import annotations

import dataclasses

from pmll_lab.bench import H200_L2_BYTES
from pmll_lab.experiments.targets import Target

ROOF, PROTO, STEP, KERNELS = "roofline", "carry_protocol", "carry_step", "kernels"
ROOF_LAUNCH, PROTO_LAUNCH = "roofline:launches", "carry_protocol:launches"
GDN_VERIFY, CONV, PMLL_RING, ATTENTION, SPEC = ("gdn_verify", "gdn_conv", "pmll_ring",
                                                "pmll_attention", "spec_decode")
B_MAIN = (64, 128)
B_ALL = (1, 8, 64, 128, 256)
QWEN3_NEXT = {"HK": 16, "HV": 32, "head_dim": 128}
"""The GDN layer's shape (Qwen3-Next: 16 key heads, 32 value heads, head size 128) the GDN
targets are judged at (a grid may span others); with ``dtype`` bf16 inputs where the rows name
them (``QWEN3_NEXT_BF16``)."""
QWEN3_NEXT_BF16 = dict(QWEN3_NEXT, dtype="bfloat16")
PLAN_TARGET_US = 10.0
"""The B = 1 verify call's host-included time the roofline's launch-plan targets bound (µs)."""
L2_RINGS = 4 * H200_L2_BYTES
"""Launches at least this many bytes (4x the H200's L2) count for the PMLL bandwidth targets."""
PMLL_CELL = ("B", "H", "M", "T", "D", "dtype", "gate")
"""A PMLL ring launch's cell: every one must meet a bandwidth target (the worst is shown)."""


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
    *(Target(text, ours, peer, bound, where=dict(QWEN3_NEXT_BF16, K=K, B=list(Bs),
                                                  state_dtype=sd),
             per=("B",), **{"reports": (ROOF_LAUNCH,), **kw})
      for text, ours, peer, bound, K, Bs, sd, kw in (
        # single launches of the verify kernels (the roofline's detail), fp32 unless named
        ("decode K=1: ours <= FlashInfer decode", "decodes", "flashinfer_decode", 1.0, 1,
         (64, 128, 256), F32, {}),
        ("decode K=1 >= 85% of the copy roofline", "decodes", None, 0.85, 1, (64, 128, 256),
         F32, {"kind": "frac"}),
        ("decode K=1 faster than FLA", "decodes", "fla_fused_recurrent", 1.0, 1, (64, 128, 256),
         F32, {}),
        ("snapshot verify K=4: chain + K-1 snapshots <= FlashInfer mtp with its snapshot "
         "buffer", "chain_snapshots", "flashinfer_mtp_snapshots", 1.0, 4, (64, 128, 256), F32,
         {}),
        ("snapshot chain K=4 >= 75% of the copy roofline", "chain_snapshots", None, 0.75, 4,
         B_MAIN, F32, {"kind": "frac"}),
        ("carry lazy exact K=4, amortised: <= 0.4x FlashInfer's snapshot verify",
         "carry_exact_lazy", "flashinfer_mtp_snapshots", 0.4, 4, B_MAIN, F32, {}),
        ("carry lazy exact K=4 without write-back <= FlashInfer mtp frozen, no buffer",
         "carry_exact_lazy:nowb", "flashinfer_mtp_frozen", 1.0, 4, B_MAIN, F32,
         {"show": ("mean_pend",)}),
        ("carry lazy exact K=4, amortised: >= 50% of the copy roofline", "carry_exact_lazy",
         None, 0.5, 4, B_MAIN, F32, {"kind": "frac"}),
        ("carry lazy exact K=4: >= 2.5x faster than FLA (same K rows)", "carry_exact_lazy",
         "fla_fused_recurrent", 0.4, 4, B_MAIN, F32, {}),
        ("B=1, K=4 verify, graph replay: carry lazy exact <= FlashInfer mtp with buffer",
         "carry_exact_lazy", "flashinfer_mtp_snapshots", 1.0, 4, (1,), F32,
         {"timer": "cuda_graph"}),
        (f"B=1, K=4: launch-plan call of the lazy exact verify <= {PLAN_TARGET_US:.0f} us "
         "(host included, amortised)", "carry_exact_lazy:plan", None, PLAN_TARGET_US, 4, (1,),
         F32, {"kind": "time", "timer": "do_bench"}),
        (f"B=1, K=4: lazy exact verify call <= {PLAN_TARGET_US:.0f} us (host included)",
         "carry_exact_lazy", None, PLAN_TARGET_US, 4, (1,), F32,
         {"kind": "time", "timer": "do_bench"}),
        ("bf16 state: decode K=1 <= FlashInfer decode", "decodes", "flashinfer_decode", 1.0, 1,
         (1, 64, 128, 256), "bfloat16", {}),
        ("bf16 state: chain K=4 + snapshots <= FlashInfer mtp with its snapshot buffer",
         "chain_snapshots", "flashinfer_mtp_snapshots", 1.0, 4, (1, 64, 128, 256), "bfloat16",
         {}),
        ("bf16 state: carry lazy exact K=4 without write-back <= 1.2x FlashInfer mtp frozen",
         "carry_exact_lazy:nowb", "flashinfer_mtp_frozen", 1.2, 4, (1, 64, 128, 256),
         "bfloat16", {}),
        ("decode K=1, CUDA C++ twin <= FlashInfer decode, fp32 state", "decodes_cuda",
         "flashinfer_decode", 1.0, 1, B_ALL, F32, {}),
        ("decode K=1, CUDA C++ twin <= FlashInfer decode, bf16 state", "decodes_cuda",
         "flashinfer_decode", 1.0, 1, B_ALL, "bfloat16", {}),
        ("decode K=1, CUDA C++ twin / Triton decode (reported)", "decodes_cuda", "decodes",
         None, 1, B_ALL, F32, {}),
        ("chain K=4 + snapshots, CUDA C++ twin / FlashInfer mtp + buffer (reported)",
         "chain_snapshots_cuda", "flashinfer_mtp_snapshots", None, 4, B_ALL, F32, {}),
        ("chain K=4 + snapshots, CUDA C++ twin / Triton chain (reported)",
         "chain_snapshots_cuda", "chain_snapshots", None, 4, B_ALL, F32, {}),
        # the carried verify's single launches (carry_protocol's detail; bf16 inputs as rows)
        ("carry exact lazy <= 0.4x FlashInfer's snapshot verify", "carry_exact_lazy",
         "flashinfer_mtp_snapshots", 0.4, 4, B_MAIN, None, {"reports": (PROTO_LAUNCH,)}),
        ("carry exact lazy >= 2.5x faster than FLA fused_recurrent (same K rows)",
         "carry_exact_lazy", "fla_fused_recurrent", 0.4, 4, B_MAIN, None,
         {"reports": (PROTO_LAUNCH,)}),
        ("carry exact lazy >= 50% of the copy roofline", "carry_exact_lazy", None, 0.5, 4,
         B_MAIN, None, {"kind": "frac", "reports": (PROTO_LAUNCH,)}),
        ("carry exact lazy against our chain + K-1 snapshots", "carry_exact_lazy",
         "chain_snapshots", None, 4, B_MAIN, None, {"reports": (PROTO_LAUNCH,)}),
        # the snapshot chain (gdn_verify)
        ("chain + K-1 snapshots <= FlashInfer mtp with its snapshot buffer, K=4", "chain",
         "flashinfer_mtp_snapshots", 1.0, 4, (64, 128, 256), None,
         {"reports": (GDN_VERIFY,)}),
        ("chain + K-1 snapshots >= 75% of the copy roofline, K=4", "chain", None, 0.75, 4,
         B_MAIN, None, {"kind": "frac", "reports": (GDN_VERIFY,)}),
        ("chain + K-1 snapshots against FLA fused_recurrent (no snapshots), K=4", "chain",
         "fla_fused_recurrent", None, 4, (64,), None, {"reports": (GDN_VERIFY,)}),
      )),
    # the conv twin (gdn_conv), Qwen3-Next's conv (dim 8192), bf16, K = 4, B = 64
    *(Target(text, ours, peer, bound, where=dict(shape="qwen3-next", dtype="bfloat16", K=4,
                                                  B=[64]), per=("B",), reports=(CONV,), **kw)
      for text, ours, peer, bound, kw in (
        ("carry verify, lazy, against the chain + window snapshots", "carry_lazy", "chain",
         None, {}),
        ("K successive conv_update against the chain", "updates", "chain", None, {}),
        ("chain + window snapshots: fraction of the copy roofline", "chain", None, None,
         {"kind": "frac"}),
      )),
    # the PMLL ring: Triton on launches past the L2, the CUDA twins at T = M = 8192
    *(Target(text, {"kernel": kernel, "impl": impl}, peer, bound, kind=kind, over=PMLL_CELL,
             where=where, reports=(PMLL_RING,))
      for text, kernel, impl, peer, bound, kind, where in (
        (f"read >= 80% of the copy bandwidth on launches >= {L2_RINGS / 1e6:.0f} MB (4x the L2)",
         "pmll_read", "triton", None, 0.8, "frac", {"bytes": "l2_rings", "impl": "triton"}),
        (f"write, no gate, >= 80% of the copy bandwidth on launches >= {L2_RINGS / 1e6:.0f} MB",
         "pmll_write", "triton", None, 0.8, "frac",
         {"bytes": "l2_rings", "impl": "triton", "gate": "none"}),
        (f"gated write: fraction of the copy bandwidth on launches >= {L2_RINGS / 1e6:.0f} MB",
         "pmll_write", "triton", None, None, "frac",
         {"bytes": "l2_rings", "impl": "triton", "gate": ["bt", "bht"]}),
        ("CUDA twin: read >= 90% of the copy bandwidth at T = M = 8192", "pmll_read", "cuda",
         None, 0.9, "frac", {"T": 8192, "M": 8192}),
        ("CUDA twin: write, no gate, >= 90% of the copy bandwidth at T = M = 8192",
         "pmll_write", "cuda", None, 0.9, "frac", {"T": 8192, "M": 8192, "gate": "none"}),
        ("CUDA twin / Triton: read at T = M = 8192", "pmll_read", "cuda",
         {"kernel": "pmll_read", "impl": "triton"}, None, "ratio", {"T": 8192, "M": 8192}),
        ("CUDA twin / Triton: write at T = M = 8192", "pmll_write", "cuda",
         {"kernel": "pmll_write", "impl": "triton"}, None, "ratio", {"T": 8192, "M": 8192}),
      )),
    # the PMLL ring read and write as part of the roofline's detail (Triton, past the L2)
    *(Target(f"{label} >= 80% of the copy bandwidth on rings >= 4x the L2 "
             f"({L2_RINGS / 1e6:.0f} MB)", kernel, kind="frac", bound=0.8,
             where={"bytes": "l2_rings", "impl": "triton"}, over=("dtype", "gate", "M", "T"),
             reports=(ROOF_LAUNCH,))
      for kernel, label in (("pmll_read", "PMLL read"), ("pmll_write", "PMLL write"))),
    # attention straight from the ring (pmll_attention), per (H, D), every (M, T)
    Target("fused ring attention <= 0.5x gather + SDPA with mask, every M >= 1 and T",
           "fused", "gather_sdpa_mask", 0.5, where={"M": "positive"}, per=("H", "D"),
           over=("M", "T"), reports=(ATTENTION,)),
    Target("fused ring attention <= 1.1x SDPA over contiguous keys (lower-right causal), "
           "T <= 1024", "fused", "sdpa_contiguous", 1.1, where={"T": "upto_1024"},
           per=("H", "D"), over=("M", "T"), reports=(ATTENTION,)),
    Target("pmll_step (attention + ring write) <= 1.1x its attention alone, every M >= 1",
           "pmll_step", "fused", 1.1, where={"M": "positive"}, per=("H", "D"), over=("M", "T"),
           reports=(ATTENTION,)),
    # whole speculative steps on the Qwen3-Next-sized stack (spec_decode), reported
    *(Target(f"step time: {ours_label} / {peer_label} (tokens per step: the acceptance "
             "length)", dict(draft="noisy", K=4, p=0.8, kernel=ours), {"kernel": peer}, None,
             metric="step_us", where=dict(B=[64], arch="qwen3_next_sized"), per=("B",),
             reports=(SPEC,))
      for ours, ours_label, peer, peer_label in (
        ("exact_lazy", "carry exact, lazy", "plain", "plain decoding"),
        ("exact_eager", "carry exact, eager", "plain", "plain decoding"),
        ("chain", "snapshot chain", "plain", "plain decoding"),
        ("exact_lazy", "carry exact, lazy", "chain", "snapshot chain"))),
)
"""Every target; a new target or report is one more row or tag. ``where`` values that are
conditions rather than values are named (``WHERE``)."""

WHERE = {"l2_rings": lambda b: b.astype(float) >= L2_RINGS, "positive": lambda m: m >= 1,
         "upto_1024": lambda t: t <= 1024}
"""Named conditions a ``where`` gives by name (a column's mask)."""

SETS = {ROOF: "The speculative step at Qwen3-Next's shape (verify + accept/commit/restore, K=4) "
              "against FlashInfer and SGLang",
        PROTO: "The carried state's whole speculative step against the snapshot chain and the "
               "field's exact carried state",
        STEP: "The whole speculative step",
        KERNELS: "One GDN decode against FlashInfer's",
        ROOF_LAUNCH: "Verify kernels at Qwen3-Next's shape against FlashInfer, FLA and the copy "
                     "roofline",
        PROTO_LAUNCH: "Carried-state verify at Qwen3-Next's shape (HK=16, HV=32, kd=vd=128), K=4",
        GDN_VERIFY: "Snapshot verify at Qwen3-Next's shape (HK=16, HV=32, kd=vd=128, bf16 "
                    "inputs)",
        CONV: "Conv twin verify at Qwen3-Next's conv (dim 8192, bf16), K=4, B=64",
        PMLL_RING: "PMLL ring read and write against the copy roofline",
        ATTENTION: "Attention straight from the ring against PyTorch SDPA",
        SPEC: "Speculative decoding on the Qwen3-Next-sized stack, B=64, K=4, noisy draft p=0.8"}
"""The title of each report's targets."""


def _resolved(t: Target) -> Target:
    """``t`` with its named ``where`` conditions (``WHERE``) made masks, and a ``where`` value
    of ``None`` (a column the rows leave to their default) dropped."""
    where = {k: WHERE[v] if isinstance(v, str) and v in WHERE else v
             for k, v in t.where.items() if v is not None}
    return dataclasses.replace(t, where=where)


def for_report(notebook: str) -> tuple[Target, ...]:
    """The targets report ``notebook`` shows (a key of ``SETS``; ``ValueError`` naming
    ``notebook`` for another)."""
    if notebook not in SETS:
        raise ValueError(f"notebook: no targets for {notebook!r} ({', '.join(SETS)})")
    return tuple(_resolved(t) for t in TARGETS if notebook in t.reports)
