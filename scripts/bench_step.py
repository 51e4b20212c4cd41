"""The whole speculative step (verify + accept/commit/restore), form by form, between report runs.

The notebooks' step sweep without the notebook: for each registered ``gdn_step``
implementation, state dtype and batch, the one runner (``pmll_lab.harness.runner.run_point``) on
Qwen3-Next's GDN shape (HK=16, HV=32, kd=vd=128, bf16 inputs, K=4, 16 steps, acceptance 0.8):
checked against float64 decoding of the accepted rows, then its 16 steps timed as one CUDA
graph. ``--unpaired`` compiles the Triton kernels with one conversion per element
where a 2-byte state is rounded (``recurrence.PAIRED_ROUNDING`` off: the kernels before paired
rounding, for a before/after in one machine session); ``--set NAME=VALUE`` runs under
``settings.override(NAME=VALUE)`` (e.g. ``--set ring_fold_chunk=16``); ``--ring-variant SPEC`` (repeatable) runs the ``ring`` form
once per SPEC, ``lib`` or a probe file defining ``gdn_ring_fused_kernel`` (as
``tune_ring.py --kernels``), each optionally followed by ``+NAME=VALUE`` settings, e.g.
``--ring-variant lib --ring-variant lib+ring_fold_chunk=16``: variants beside FlashInfer in one
process. Prints µs per step and writes JSON lines to ``--out`` (with the device, versions and
commit). Usage (GPU): ``python3 scripts/bench_step.py --forms exact_lazy,chain_restore
--states bfloat16,float32 --batches 1,64,128 [--unpaired] [--out F]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys

import pmll_lab  # noqa: F401  (first: picks the device)
import torch
import triton.language as tl

from pmll_lab.harness import registry
from pmll_lab.harness.runner import run_point
from pmll_lab.backend import DEVICE
from pmll_lab.results import provenance
from pmll_lab.bench import cli_out, variant_kernel, variant_problem
from pmll_lab.ops import settings
from pmll_lab.ops.carry import ring as ring_form
from pmll_lab.ops.gdn import recurrence
from pmll_lab.harness import step_forms as SF


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", default="exact_lazy,exact_eager,chain_restore",
                    help="comma-separated registered gdn_step implementations "
                         "(pmll_lab.harness.registry.names('gdn_step'))")
    ap.add_argument("--states", default="bfloat16,float32",
                    help="comma-separated state pool dtypes: float32, bfloat16, float16")
    ap.add_argument("--batches", default="1,64,128", help="comma-separated B, each >= 1")
    ap.add_argument("--unpaired", action="store_true",
                    help="one conversion per element when rounding a 2-byte state")
    ap.add_argument("--out", default=None, help="JSON lines, one row per form and case")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a launch setting to override (pmll_lab.ops.settings), repeatable")
    ap.add_argument("--ring-variant", action="append", default=[], metavar="SPEC",
                    help="lib or a probe FILE defining gdn_ring_fused_kernel, then optional "
                         "+NAME=VALUE settings; repeatable; the ring form runs once per SPEC")
    a = ap.parse_args(argv)
    cli_out(ap, "--out", a.out)
    over = _settings(ap, "--set", a.set)
    variants = []
    for spec in a.ring_variant or ["lib"]:
        kfile, *items = spec.split("+")
        problem = variant_problem(ring_form, "gdn_ring_fused_kernel", kfile)
        if problem:                         # loaded once here: a bad file stops the run now
            ap.error(f"--ring-variant: {problem}")
        vover = _settings(ap, "--ring-variant", items)
        both = sorted(set(vover) & set(over))
        if both:
            ap.error(f"--ring-variant: {spec!r} sets {', '.join(both)}, which --set sets too")
        seen = sum(v[0].split("#")[0] == spec for v in variants)   # a spec repeated (lib
        variants.append((f"{spec}#{seen + 1}" if seen else spec, kfile, vover))  # first, last)
    if a.ring_variant and SF.RING.name not in a.forms.split(","):
        ap.error("--ring-variant: applies to the ring form, which --forms does not list")
    states = a.states.split(",")
    for sd in states:
        if sd not in registry.STATE_DTYPES:
            ap.error(f"--states: {sd!r} not in {', '.join(registry.STATE_DTYPES)}")
    try:
        batches = [int(x) for x in a.batches.split(",")]
    except ValueError:
        ap.error(f"--batches: expected comma-separated ints, got {a.batches!r}")
    if not batches or min(batches) < 1:
        ap.error(f"--batches: every B must be >= 1, got {a.batches!r}")
    if a.unpaired:          # before any kernel compiles: Triton keys its cache on the value
        recurrence.PAIRED_ROUNDING = tl.constexpr(False)
    forms = a.forms.split(",")
    try:
        registry.resolve("gdn_step", forms)
    except ValueError as exc:
        ap.error(f"--forms: {exc}")
    if DEVICE.type != "cuda":
        ap.error("needs a GPU: the H200 shape (HK=16, HV=32, kd=vd=128) on the Triton "
                 "interpreter would take hours (the tests run small cases on the CPU)")
    rows, failed, env = [], 0, provenance()
    stack = contextlib.ExitStack()
    stack.enter_context(settings.override(**over))      # ValueError naming a bad setting
    for sd in states:
        for B in batches:
            for form, (label, kfile, vover) in [
                    (f, v) for f in forms
                    for v in (variants if f == SF.RING.name else [("lib", "lib", {})])]:
                row = dict(form=form, impl=registry.get(form).impl, state_dtype=sd, B=B,
                           paired=not a.unpaired, settings={**over, **vover}, **env)
                if form == SF.RING.name:
                    row["variant"] = label
                try:
                    with variant_kernel(ring_form, "gdn_ring_fused_kernel", kfile), \
                          settings.override(**vover):
                        got = run_point("gdn_step", dict(
                            B=B, K=4, HK=16, HV=32, head_dim=128, steps=16, alpha=0.8,
                            state_dtype=sd), [form])
                    for r in got:
                        if r["metric"] == "rel_l2":
                            row[f"{r['what']}_rel_l2"] = r["value"]
                        elif r["metric"] == "step_us" and r.get("timer") == "cuda_graph":
                            row.update(step_us=r["value"], p20_us=r["p20"], p80_us=r["p80"])
                    bad = [r for r in got if r["status"] != "ok"]
                    row["status"] = (bad[0]["status"] if bad else "ok") + (
                        f": {bad[0].get('error') or bad[0].get('note')}" if bad else "")
                    row["status"] = row["status"].replace("unsupported: ", "unsupported ")
                except Exception as exc:             # one case's failure loses no other
                    row["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
                failed += not row["status"].startswith(("ok", "unsupported"))
                rows.append(row)
                name = form if form != SF.RING.name or len(variants) == 1 else f"ring[{label}]"
                print(f"{name:22s} {sd:9s} B={B:4d} {row.get('step_us', float('nan')):9.1f} us"
                      f"  o_rel_l2 {row.get('o_rel_l2', float('nan')):.2e}  {row['status']}",
                      flush=True)
                if a.out:
                    with open(a.out, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
    stack.close()
    return 1 if failed else 0


def _settings(ap, flag, items):
    """``NAME=VALUE`` items as a checked settings override (``ap.error`` naming ``flag``)."""
    try:
        return settings.parse_overrides(items)
    except ValueError as exc:
        ap.error(f"{flag}: {exc}")

if __name__ == "__main__":
    sys.exit(main())
