"""The family tuning scripts on the CPU interpreter: their subcommands dispatch, and the smoke
modes run their checks (tiny sizes; the timings they print mean nothing here)."""

from __future__ import annotations

import importlib.util

import pytest

import pmll_lab  # noqa: F401  (first)
from _paths import ROOT


def _script(name):
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name, commands", [("tune_gdn", "tiles,carry"),
                                            ("tune_pmll", "ring,attention")])
def test_family_scripts_name_their_subcommands(name, commands):
    for argv in ([], ["nope"]):
        with pytest.raises(SystemExit, match=f"usage: {name}.py {{{commands}}}"):
            _script(name).main(argv)
    for flag in ("-h", "--help"):     # asking for help is not an error
        with pytest.raises(SystemExit) as exit_:
            _script(name).main([flag])
        assert exit_.value.code == 0


def test_tune_gdn_carry_smoke_checks_both_launches(capsys):
    _script("tune_gdn").main(["carry", "--smoke"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("B=")]
    assert len(lines) == 2 and all("bitwise=1 ok" in line for line in lines), out


def test_tune_pmll_attention_smoke_checks_each_tile(capsys):
    _script("tune_pmll").main(["attention", "--quick", "--shapes", "1,1,16", "--cells", "8,8"])
    out = capsys.readouterr().out
    assert "best: attention_tiles ((16, 2)," in out and "error" not in out, out
