"""``pmll_lab.lowering``'s own contract: its errors name the argument, its layout parser reads
every form of TTGIR layout, its CLI says how to run it without compiled kernels."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _lowering_helpers import ROOT, run_lowered


def test_lower_needs_compiled_kernels_and_every_argument():
    from pmll_lab import INTERPRET
    from pmll_lab.lowering import lower
    from pmll_lab.ops.gdn.decode import gdn_rows_kernel


    if INTERPRET:
        with pytest.raises(RuntimeError, match="PMLL_LAB_DEVICE=lower"):
            lower(gdn_rows_kernel, {}, {})
    else:   # compiled kernels (a GPU machine): lowering runs, and names what is missing
        with pytest.raises(ValueError, match="types: no Triton type for argument 'state'"):
            lower(gdn_rows_kernel, {}, {})


BAD_CALLS = textwrap.dedent("""
    import json, sys
    from pmll_lab.lowering import gdn_exact_family, lower
    from pmll_lab.ops.gdn.decode import gdn_rows_kernel
    out = {}
    for name, call in (
        ("type", lambda: lower(gdn_rows_kernel, {"state": "foo"}, {})),
        ("unaligned", lambda: lower(gdn_rows_kernel, {}, {}, unaligned=("no_such_arg",))),
        ("extra_type", lambda: lower(gdn_rows_kernel, {"KD": "i32"}, {})),
        ("rows", lambda: gdn_exact_family(rows=0)),
        ("heads", lambda: gdn_exact_family(heads=(16, 24))),
    ):
        try:
            call()
            out[name] = "no error"
        except ValueError as exc:
            out[name] = str(exc)
    json.dump(out, sys.stdout)
""")


def test_lowering_rejects_bad_arguments_naming_them():
    run = run_lowered(BAD_CALLS)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout)
    assert got["type"].startswith("types: 'state' has type 'foo'"), got
    assert got["unaligned"].startswith("unaligned: ['no_such_arg']"), got
    assert got["extra_type"].startswith("types: ['KD']"), got
    assert got["rows"].startswith("rows: must lie in 1..8"), got
    assert got["heads"].startswith("heads: value heads 24"), got


def test_reduction_layouts_reads_inline_and_aliased_layouts():
    """A reduce whose operand layout is written inline (a slice of an aliased parent) is read,
    its parent resolved; a module whose reduce cannot be parsed raises instead of dropping it."""
    from pmll_lab.lowering import reduction_layouts


    blocked = "#ttg.blocked<{sizePerThread = [1, 4], threadsPerWarp = [4, 8], warpsPerCTA = [1, 1], order = [1, 0]}>"
    text = "\n".join([
        f"#blocked = {blocked}",
        "module {",
        '    %a = "tt.reduce"(%x) <{axis = 0 : i32}> ({',
        "    ^bb0(%p: f32, %q: f32):",
        "      %s = arith.addf %p, %q : f32",
        "      tt.reduce.return %s : f32",
        "    }) : (tensor<128xf32, #ttg.slice<{dim = 1, parent = #blocked}>>) -> f32",
        '    %b = "tt.reduce"(%y) <{axis = 0 : i32}> ({',
        "    ^bb0(%p: f32, %q: f32):",
        "      tt.reduce.return %p : f32",
        "    }) : (tensor<128x32xf32, #blocked>) -> tensor<32xf32, #ttg.slice<{dim = 0, parent = #blocked}>>",
        "}",
    ])
    assert reduction_layouts(text) == [
        f"128xf32, #ttg.slice<{{dim = 1, parent = {blocked}}}>",
        f"128x32xf32, {blocked}",
    ]
    with pytest.raises(ValueError, match="unterminated tt.reduce"):
        reduction_layouts('%a = "tt.reduce"(%x) <{axis = 0 : i32}> ({\n  ^bb0:\n')


def test_cli_without_lower_device_says_how_to_run_it():
    """``python -m pmll_lab.lowering`` with interpreted kernels (``PMLL_LAB_DEVICE=cpu``): exit 2
    and one line saying to set ``PMLL_LAB_DEVICE=lower`` without ``TRITON_INTERPRET``, no
    traceback."""
    env = dict(os.environ, PMLL_LAB_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "pmll_lab.lowering", "--rows", "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if "PMLL_LAB_DEVICE" in ln]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "PMLL_LAB_DEVICE=lower" in lines[0] and "TRITON_INTERPRET" in lines[0]
    assert res.stdout == ""
