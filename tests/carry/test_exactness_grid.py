"""The exactness grid runner (``pmll_lab.experiments.exactness``) on a small sub-grid: the exact
carry (eager, lazy, serving policy) and the chain bitwise equal to plain decoding of the
accepted rows (SPEC §2 "Exactness", §3b), and the runner itself seeing a one-bit difference.

Sizes: on the interpreter ``B = 2`` sequences, 4 steps, ``HK, HV = 1, 2`` (10-33 s per
configuration on a shared 2-core machine, 96 s for the file measured); on a GPU ``B = 32``,
12 steps, the grid's own default.
The sub-grid holds the corner an H200 found off decode (kd = 16, K-major, bf16 state and
inputs, K = 4), its V-major twin, a narrow fp16 state with fp32 inputs, an fp32 state at
K = 3 and K = 8 (past the eager fold limit: policy flushes in the eager run). V-major tiles are the
interpreter's slowest (32 s for the one here), so the sub-grid holds one.
"""

from __future__ import annotations

import json

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.backend import DEVICE
from pmll_lab.experiments import exactness as E

ON_CPU = DEVICE.type == "cpu"
SIZE = dict(B=2, steps=4) if ON_CPU else dict(B=32, steps=12)

SUB_GRID = [
    dict(kd=16, layout="kv", state_dtype="bfloat16", input_dtype="bfloat16", K=4),
    dict(kd=16, layout="vk", state_dtype="bfloat16", input_dtype="bfloat16", K=4),
    dict(kd=16, layout="kv", state_dtype="float16", input_dtype="float32", K=2),
    dict(kd=16, layout="kv", state_dtype="float32", input_dtype="bfloat16", K=3),
    dict(kd=16, layout="kv", state_dtype="bfloat16", input_dtype="float32", K=8),
]


@pytest.mark.parametrize("cfg", SUB_GRID, ids=E.config_name)
def test_sub_grid_is_bitwise(cfg):
    """Every accepted row's output and the final state of every form equal plain decoding
    bit for bit; every form compared rows (0 and K accepted included by the seeded draw). The
    speculative store (V-major only) is refused on a K-major state before any launch, and on
    a V-major one moved sequences to their spare slots (``swaps``)."""
    rec = E.run_config(cfg, seed=3, **SIZE)
    assert rec["status"] == "bitwise", "\n".join([E.summary_line(rec), *E.detail_lines(rec)])
    assert rec["rows_differing"] == 0 and rec["max_abs_state_diff"] == 0.0
    assert [r["form"] for r in rec["forms"]] == list(E.FORMS)
    for r in rec["forms"]:
        if r["form"] == "carry_spec" and cfg["layout"] == "kv":
            assert r["status"] == "n/a" and "vk" in r["reason"], r   # V-major only: not run
            continue
        assert r["rows_compared"] > 0 and r["state_bitwise"], r["form"]
    stats = {r["form"]: r["stats"] for r in rec["forms"] if "stats" in r}
    assert stats["carry_eager"]["lazy_steps"] == 0 and stats["carry_lazy"]["eager_steps"] == 0
    assert stats["carry_policy"]["lazy_steps"] and stats["carry_policy"]["eager_steps"]
    if cfg["layout"] == "vk":
        assert stats["carry_spec"]["swaps"] > 0
    else:
        assert "n/a: carry_spec" in E.summary_line(rec)


def test_a_commit_that_never_swaps_is_caught(monkeypatch):
    """The speculative store's commit replaced by the lazy commit (pending rows kept, no swap to
    the spare slot): outputs and states stay plain decoding's, so only the protocol check can
    see it; every full acceptance is a mismatch and the form is not bitwise."""
    from pmll_lab.carry import carry_accept

    def lazy_only(carry, slot_tab, spec_slot_tab, engaged, accepted, *, rows, validate=False):
        carry_accept(carry, slot_tab, engaged, accepted, rows=rows, validate=validate)

    monkeypatch.setattr(E, "carry_accept_spec", lazy_only)
    cfg = dict(kd=16, layout="vk", state_dtype="float32", input_dtype="float32", K=2)
    rec = E.run_config(cfg, seed=3, forms=("carry_spec",), **SIZE)
    run = rec["forms"][0]
    assert rec["status"] == "differs" and run["rows_differing"] == 0 and run["state_bitwise"]
    assert run["protocol_mismatches"] > 0 and run["stats"]["swaps"] == 0
    assert run["details"][0]["what"] == "swap"
    assert "protocol mismatches" in "\n".join(E.detail_lines(rec))


def test_runner_reports_a_one_bit_difference(monkeypatch, tmp_path, capsys):
    """Plain decoding with one bit flipped in one output (its third call) and in one state
    element (its last call, so no later row reads it): the runner counts exactly one
    differing row, the state as not bitwise, says where, writes the record and exits 1.
    The same run unflipped is bitwise (and counts the calls)."""
    argv = ["--head-dims", "16", "--layouts", "kv", "--state-dtypes", "float32",
            "--input-dtypes", "float32", "--rows", "2", "--forms", "carry_eager",
            "--batch", "3", "--steps", "4"]
    calls = {"n": 0, "flip_o": None, "flip_state": None}
    real = E.gdn_decode

    def flip(t):
        flat = t.view(-1).view({2: torch.int16, 4: torch.int32}[t.element_size()])
        flat[0] ^= 1

    def decode(state, *args, **kw):
        o = real(state, *args, **kw)
        calls["n"] += 1
        if calls["n"] == calls["flip_o"]:
            flip(o)
        if calls["n"] == calls["flip_state"]:
            flip(state)
        return o

    monkeypatch.setattr(E, "gdn_decode", decode)
    assert E.main(argv) == 0
    last = calls["n"]
    assert last >= 4
    calls.update(n=0, flip_o=3, flip_state=last)
    out = tmp_path / "grid.jsonl"
    capsys.readouterr()
    assert E.main(argv + ["--out", str(out)]) == 1
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["status"] == "differs" and rec["rows_differing"] == 1 and not rec["bitwise"]
    run = rec["forms"][0]
    assert not run["state_bitwise"] and run["max_abs_state_diff"] > 0
    row = run["details"][0]
    assert row["element"] == [0, 0] and row["elements_differing"] == 1
    assert {"step", "b", "slot", "t", "pend", "write_back", "got", "want"} <= set(row)
    assert run["first_state_diff"]["elements_differing"] == 1
    text = capsys.readouterr().out
    assert "bitwise no" in text and "first state diff" in text
    assert "summary: 0 bitwise, 1 differs" in text


PACKED = """
import json, sys
import pmll_lab
from pmll_lab.backend import DEVICE
from pmll_lab.experiments import exactness as E
from pmll_lab.ops.gdn import recurrence
import os
assert recurrence.PACKED_STATE_TILE, "PMLL_LAB_PACKED_STATE_TILE=1 did not switch it on"
size = dict(B=2, steps=4) if DEVICE.type == "cpu" else dict(B=32, steps=12)
for cfg in json.loads(sys.argv[1]):
    rec = E.run_config(cfg, seed=5, **size)
    print(E.config_name(cfg), rec["status"], rec["rows_differing"], rec["max_abs_state_diff"])
"""

PACKED_GRID = [
    dict(kd=16, layout="kv", state_dtype="bfloat16", input_dtype="bfloat16", K=4),
    dict(kd=32, layout="vk", state_dtype="bfloat16", input_dtype="bfloat16", K=3),
    dict(kd=16, layout="kv", state_dtype="float16", input_dtype="float32", K=8),
]


def test_packed_state_tile_is_bitwise():
    """With a 2-byte tile held as 2-byte pairs between rows (``packed_state_tile``, set in a
    fresh process: it is fixed at import), every form still equals plain decoding bit for bit:
    bf16 state in both layouts, fp16 with fp32 inputs past the eager fold limit (K = 8)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PMLL_LAB_PACKED_STATE_TILE="1")
    run = subprocess.run([sys.executable, "-c", PACKED, json.dumps(PACKED_GRID)], env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.split("\n")
    got = [ln.split() for ln in lines if ln.strip()]
    assert [g[0] for g in got] == [E.config_name(c) for c in PACKED_GRID], run.stdout
    for name, status, rows, diff in got:
        assert (status, rows, float(diff)) == ("bitwise", "0", 0.0), (name, status, rows, diff)
