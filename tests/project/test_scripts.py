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


@pytest.mark.parametrize("name, argv, said", [
    ("tune_gdn", ["tiles", "--B", "0"], "--B: expected comma-separated ints, each >= 1"),
    ("tune_gdn", ["tiles", "--B", "x"], "--B: expected comma-separated ints"),
    ("tune_gdn", ["tiles", "--ahead", "x"], "--ahead: expected 'default' or R-C-S ints"),
    ("tune_gdn", ["tiles", "--ahead", "1-2"], "--ahead: each item 'default' or three ints"),
    ("tune_gdn", ["tiles", "--family", "128:4:bf17"], "--family: items kd:K:dtype"),
    ("tune_gdn", ["tiles", "--json", "/no/such/dir/r.json"], "--json: cannot write"),
    ("tune_gdn", ["tiles", "--kv-blocks", "x"], "--kv-blocks: expected BVxW[:nopf] items"),
    ("tune_gdn", ["tiles", "--kv-blocks", "16x1:nopff"], "the only option is ':nopf'"),
    ("tune_gdn", ["tiles", "--kv-blocks", "16x0"], "--kv-blocks: "),
    ("tune_gdn", ["tiles", "--tiles", "0x0"], "--tiles: "),
    ("tune_gdn", ["tiles", "--kernels", "decode,nosuch"], "--kernels: nosuch not among"),
    ("tune_gdn", ["tiles"], "needs a GPU (tiles times the GDN kernels)"),
    ("tune_gdn", ["carry"], "needs a GPU (carry times"),
    ("tune_pmll", ["ring"], "needs a GPU (ring times"),
    ("tune_pmll", ["attention", "--stages", "0"], "--stages: expected comma-separated ints"),
    ("tune_pmll", ["attention", "--stages", "x"], "--stages: expected comma-separated ints"),
    ("tune_pmll", ["attention", "--shapes", "1,2"], "--shapes: expected ';'-separated groups of 3"),
    ("tune_pmll", ["attention", "--shapes", "0,0,0"], "--shapes: expected ';'-separated groups"),
    ("tune_pmll", ["attention", "--cells", "8"], "--cells: expected ';'-separated groups of 2"),
    ("tune_pmll", ["attention", "--cells", "8,-1"], "each >= 0"),
    ("bench_twins", ["--batches", "0"], "--batches: expected comma-separated ints, each >= 1"),
    ("bench_twins", ["--out", "/no/such/dir/t.jsonl"], "--out: cannot write"),
    ("bench_twins", [], "needs a GPU (the CUDA twins)"),
    ("bench_step", ["--out", "/no/such/dir/s.jsonl"], "--out: cannot write"),
    ("train_tiny_gdn", ["--steps", "0", "--out", "/tmp/x"], "--steps: must be >= 1"),
    ("train_tiny_gdn", ["--steps", "5"], "--steps: a run of other steps"),
    ("train_tiny_gdn", ["--device", "xyz"], "--device: cpu or cuda"),
])
def test_script_flags_are_refused_naming_the_flag_before_any_work(name, argv, said, capsys):
    """Bad flags of the GPU scripts, and a timing run without a GPU, stop with a message naming
    the flag before anything is measured (or a committed checkpoint replaced)."""
    with pytest.raises(SystemExit) as stop:
        _script(name).main(argv)
    assert stop.value.code == 2, capsys.readouterr()
    assert said in capsys.readouterr().err


def test_tune_ring_refuses_an_unwritable_json(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["tune_ring.py", "--json", "/no/such/dir/r.json"])
    with pytest.raises(SystemExit):
        _script("tune_ring").main()
    assert "--json: cannot write" in capsys.readouterr().err
