"""docs/adding-a-kernel.md runs as written: its plugin file registers a decode of one's own,
and the runner checks it beside ours against the float64 reference (a fresh Python, the CPU);
the registry refuses what a researcher would get wrong (a taken name, an unknown family, a
missing plugin file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pmll_lab.harness import registry
from pmll_lab.harness.registry import Implementation
from _paths import ROOT

DOC = ROOT / "docs" / "adding-a-kernel.md"


def test_the_example_runs_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 4, "the page has two plugin files and a script for each"
    plugin, script = blocks[:2]
    assert plugin.startswith("# my_decode.py")
    (tmp_path / "my_decode.py").write_text(plugin)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PMLL_LAB_DEVICE": "cpu"}
    env.pop("PMLL_LAB_PLUGINS", None)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = {tuple(line.split()[:2]): line.split() for line in run.stdout.splitlines()}
    for kernel in ("decode", "my_decode"):
        for what, tol in (("o", 8e-3), ("state", 1e-5)):
            _, _, value, verdict = got[(kernel, what)]
            assert verdict == "passed" and float(value) <= tol, run.stdout


def test_a_wrong_decode_of_ones_own_fails_its_check():
    """The runner is not fooled: a decode that forgets the decay is refused by the check and
    never timed."""
    import pmll_lab.harness.decode as D
    from pmll_lab.harness import runner

    def no_decay(state, *, q, k, v, a, b, A_log, dt_bias, state_indices, scale):
        import torch.nn.functional as F

        s = state_indices.long()
        group = v.shape[1] // q.shape[1]
        qn = F.normalize(q.float(), dim=-1).repeat_interleave(group, 1) * scale
        kn = F.normalize(k.float(), dim=-1).repeat_interleave(group, 1)
        H = state[s].float()
        u = b.float().sigmoid()[..., None] * (v.float() - (H @ kn[..., None])[..., 0])
        H = H + u[..., None] * kn[..., None, :]
        state[s] = H.to(state.dtype)
        return (H @ qn[..., None])[..., 0].bfloat16()

    registry.register(Implementation(name="test_no_decay", family="gdn_decode",
                                     label="no decay", provider="yours", impl="torch",
                                     build=D.decode_run(no_decay)), replace=True)
    try:
        rows = runner.run_point("gdn_decode", dict(B=3, HK=1, HV=2, head_dim=16,
                                                   state_dtype="float32", seed=4),
                                ["test_no_decay"])
    finally:
        registry.unregister("test_no_decay")
    checks = [r for r in rows if r["metric"] == "rel_l2"]
    assert checks and all(r["status"] == "failed" for r in checks), rows
    assert not any(r["passed"] for r in checks if r["what"] == "state")
    assert not any(r["metric"] == "time_us" for r in rows)


def test_registry_refuses_with_the_argument_named(tmp_path):
    impl = registry.get("decode")
    with pytest.raises(ValueError, match="name: 'decode' is already registered"):
        registry.register(impl)
    with pytest.raises(ValueError, match="family: 'nope' is not a registered family"):
        registry.register(Implementation(name="x", family="nope", label="x", build=len))
    with pytest.raises(ValueError, match="provider"):
        Implementation(name="x", family="gdn_decode", label="x", build=len, provider="me")
    for bad in ("my decode", "ümlaut", "１２", "x" * 65, "_lead", ""):
        with pytest.raises(ValueError, match="^name: an ASCII letter"):
            Implementation(name=bad, family="gdn_decode", label="x", build=len)
    with pytest.raises(ValueError, match="^name: 'all' selects every implementation"):
        Implementation(name="all", family="gdn_decode", label="x", build=len)
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match="^label: the text tables and plots show"):
            Implementation(name="x", family="gdn_decode", label=bad, build=len)
    with pytest.raises(ValueError, match="plugins: no such file"):
        registry.load_plugins(str(tmp_path / "missing.py"))
    raising = tmp_path / "raising.py"
    raising.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match=r"plugins: .*raising\.py raised RuntimeError: boom"):
        registry.load_plugins(str(raising))
    with pytest.raises(ValueError, match="name: 'decode' is GDN decode .*choose another name"):
        registry.register(Implementation(name="decode", family="gdn_decode", label="mine",
                                         provider="yours", impl="torch", build=len),
                          replace=True)
    with pytest.raises(ValueError, match="state_dtypes"):
        Implementation(name="x", family="gdn_decode", label="x", build=len,
                       state_dtypes=("bf16",))
    from pmll_lab.harness import runner
    with pytest.raises(ValueError, match="names: 'ring' is a gdn_step implementation"):
        runner.run_point("gdn_decode", dict(B=2, HK=1, HV=2, head_dim=16,
                                            state_dtype="float32"), ["ring"])
    with pytest.raises(ValueError, match="point: sead not an axis of the gdn_decode family"):
        runner.run_point("gdn_decode", dict(B=2, HK=1, HV=2, head_dim=16, sead=3,
                                            state_dtype="float32"), "decode")
    with pytest.raises(ValueError, match="did you mean exact_lazy"):
        registry.get("exact_lazzy")


def test_the_step_example_runs_as_written(tmp_path):
    """The page's step form of one's own (the chain, the accepted snapshot put back) passes
    the step check beside ours; the same form that ignores the accepted counts fails it."""
    plugin, script = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[2:]
    assert plugin.startswith("# my_step.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PMLL_LAB_DEVICE": "cpu"}
    env.pop("PMLL_LAB_PLUGINS", None)
    broken = plugin.replace("torch.where((a < K)[:, None, None, None], kept, state[slots])",
                            "state[slots]")
    assert broken != plugin
    for text, want in ((plugin, "passed"), (broken, "FAILED")):
        (tmp_path / "my_step.py").write_text(text)
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        got = {(w[0], " ".join(w[1:-2])): w[-1] for w in map(str.split, run.stdout.splitlines())}
        assert got[("chain_restore", "state")] == "passed", run.stdout
        assert got[("chain_restore", "state vs plain")] == "passed", run.stdout
        assert got[("my_step", "state")] == want, run.stdout
        assert got[("my_step", "state vs plain")] == want, run.stdout


PLUGIN = '''\
from pmll_lab.harness.decode import decode_bytes, decode_run
from pmll_lab.harness.registry import Implementation, register
from pmll_lab.harness.decode import DECODE
register(Implementation(name="test_plug_a", family="gdn_decode", label={label!r},
                        provider="yours", impl="torch", build=DECODE.build))
{tail}
'''


def test_a_plugin_fixed_or_edited_loads_again(tmp_path):
    """A notebook re-run after a fix: a plugin that raised (after registering one name) left
    nothing registered and loads once fixed; an edited one replaces its own entries; an
    unchanged one is not imported twice."""
    path = tmp_path / "plug.py"
    path.write_text(PLUGIN.format(label="first", tail="raise RuntimeError('half done')"))
    try:
        with pytest.raises(RuntimeError, match=r"plugins: .*plug\.py raised RuntimeError: half"):
            registry.load_plugins(str(path))
        assert "test_plug_a" not in registry.names("gdn_decode")
        path.write_text(PLUGIN.format(label="first", tail=""))
        assert registry.load_plugins(str(path)) == [str(path.resolve())]
        assert registry.get("test_plug_a").label == "first"
        assert registry.load_plugins(str(path)) == []                  # unchanged: not again
        path.write_text(PLUGIN.format(label="second, edited", tail=""))
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
        assert registry.load_plugins(str(path)) == [str(path.resolve())]
        assert registry.get("test_plug_a").label == "second, edited"
        assert registry.names("gdn_decode").count("test_plug_a") == 1
    finally:
        if "test_plug_a" in registry.IMPLEMENTATIONS:
            registry.unregister("test_plug_a")


def test_a_decode_must_return_the_inputs_dtype_and_a_raising_one_reads_failed():
    """Outputs in fp32 (not the inputs' bf16) fail the check with the contract named; a kernel
    that raises gives a failed check row (``passed`` False) with its error, so the page's
    snippet prints FAILED for it."""
    import pmll_lab.harness.decode as D
    from pmll_lab.harness import runner

    def fp32_out(state, *, q, k, v, a, b, A_log, dt_bias, state_indices, scale):
        from pmll_lab.gdn import gdn_decode

        return gdn_decode(state, q, k, v, A_log=A_log, a=a, dt_bias=dt_bias, b=b,
                          state_indices=state_indices, state_layout="vk", scale=scale).float()

    def boom(state, **kw):
        raise RuntimeError("boom inside my kernel")

    for name, fn in (("test_fp32_out", fp32_out), ("test_boom", boom)):
        registry.register(Implementation(name=name, family="gdn_decode", label=name,
                                         provider="yours", impl="torch",
                                         build=D.decode_run(fn)), replace=True)
    try:
        rows = runner.run_point("gdn_decode", dict(B=2, HK=1, HV=2, head_dim=16,
                                                   state_dtype="float32"),
                                ["decode", "test_fp32_out", "test_boom"])
    finally:
        registry.unregister("test_fp32_out")
        registry.unregister("test_boom")
    by = {}
    for r in rows:
        if r["metric"] == "rel_l2":
            by.setdefault(r["kernel"], []).append(r)
    assert all(r["passed"] for r in by["decode"])
    (bad,) = by["test_fp32_out"]
    assert bad["passed"] is False and bad["status"] == "failed"
    assert "outputs: must be [B, HV, vd] = (2, 2, 16) in the inputs' dtype torch.bfloat16, " \
           "got torch.float32" in bad["error"]
    (boomed,) = by["test_boom"]
    assert boomed["passed"] is False and "RuntimeError: boom inside my kernel" in boomed["error"]


def test_reloading_one_plugin_leaves_another_files_kernel(tmp_path):
    """Two files register the same name (``replace=True``, the page's way); the second's stands.
    Editing the first to register another name removes only what is still the first's own."""
    d1, d2 = tmp_path / "d1.py", tmp_path / "d2.py"
    body = ("from pmll_lab.harness.registry import Implementation, register\n"
            "from pmll_lab.harness.decode import DECODE\n"
            "register(Implementation(name={name!r}, family='gdn_decode', label={label!r}, "
            "provider='yours', impl='torch', build=DECODE.build), replace=True)\n")
    d1.write_text(body.format(name="test_same", label="from d1"))
    d2.write_text(body.format(name="test_same", label="from d2"))
    try:
        registry.load_plugins([str(d1), str(d2)])
        assert registry.get("test_same").label == "from d2"
        d1.write_text(body.format(name="test_other", label="d1, edited"))
        os.utime(d1, ns=(d1.stat().st_atime_ns, d1.stat().st_mtime_ns + 10**9))
        assert registry.load_plugins([str(d1), str(d2)]) == [str(d1.resolve())]
        assert registry.get("test_same").label == "from d2"
        assert registry.get("test_other").label == "d1, edited"
    finally:
        for n in ("test_same", "test_other"):
            if n in registry.IMPLEMENTATIONS:
                registry.unregister(n)
