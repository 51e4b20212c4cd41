"""Bad input to the one runner (``harness.runner.run_point``) and the kernels notebook's points
is refused with an error naming the argument, before any kernel runs (a point, an axis value,
an implementation list)."""

import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
from pmll_lab.experiments import kernels
from pmll_lab.harness import registry, workloads
from pmll_lab.harness.runner import run_point

STEP = dict(B=3, K=3, HK=1, HV=2, head_dim=16, steps=4, alpha=0.5, state_dtype="float32")
DECODE = dict(B=2, HK=1, HV=2, head_dim=16, state_dtype="float32")


@pytest.fixture
def no_build(monkeypatch):
    """Every implementation's build raises: a refusal must come before any is built."""
    def refuse(*a, **k):
        raise AssertionError("an implementation was built")
    for name in registry.names():
        impl = registry.get(name)
        monkeypatch.setitem(registry.IMPLEMENTATIONS, name,
                            type(impl)(**{**impl.__dict__, "build": refuse}))


@pytest.mark.parametrize("change, message", [
    (dict(B=-2), r"^B: must be an int >= 1, got -2"),
    (dict(B=0), r"^B: must be an int >= 1, got 0"),
    (dict(B=2.5), r"^B: must be an int >= 1, got 2.5"),
    (dict(B="2"), r"^B: must be an int >= 1, got '2'"),
    (dict(B=True), r"^B: must be an int >= 1, got True"),
    (dict(head_dim=0), r"^head_dim: must be an int >= 1"),
    (dict(K=0), r"^K: must be an int >= 1"),
    (dict(K=9), r"^K: at most 8 draft rows per verify, got 9"),
    (dict(ring_length=2), r"^ring_length: must be one of \(8, 16, 32\), got 2"),
    (dict(HK=2, HV=3), r"^HV: must be a multiple of HK = 2, got 3"),
    (dict(alpha=1.5), r"^alpha: the per-draft acceptance probability lies in \(0, 1\)"),
    (dict(alpha=1.0), r"^alpha: the per-draft acceptance probability lies in \(0, 1\) \(at 1 "),
    (dict(K=1), r"^K: at least 2 rows per verify"),
    (dict(alpha="x"), r"^alpha: the per-draft acceptance probability, a number in \(0, 1\), "
                      r"got 'x'"),
    (dict(alpha=None), r"^alpha: .* got None"),
    (dict(state_dtype="float64"), r"^state_dtype: one of float32, bfloat16, float16, got "),
    (dict(dtype="int32"), r"^dtype: one of float32, bfloat16, float16, got 'int32'"),
    (dict(dtype="float64"), r"^dtype: one of float32, bfloat16, float16, got 'float64'"),
])
def test_a_bad_step_point_is_refused_naming_its_axis(no_build, change, message):
    with pytest.raises(ValueError, match=message):
        run_point("gdn_step", {**STEP, **change}, "ring+ring_exact_fold")


def test_a_bad_decode_point_is_refused_naming_its_axis(no_build):
    with pytest.raises(ValueError, match=r"^B: must be an int >= 1, got 0"):
        run_point("gdn_decode", {**DECODE, "B": 0}, "decode")


@pytest.mark.parametrize("names, message", [
    ("", r"^names: no implementation named"),
    ([], r"^names: no implementation named"),
    ("ring+ring", r"^names: ring named twice"),
    ("ring+rign", r"^names: no implementation registered as 'rign'"),
])
def test_a_bad_implementation_list_is_refused(no_build, names, message):
    with pytest.raises(ValueError, match=message):
        run_point("gdn_step", STEP, names)


def test_kernels_notebook_runs_its_implementations_at_a_step_workloads_points(monkeypatch):
    """A step workload names the forms the step notebooks run; the kernels notebook runs them
    at its points while its ``implementations`` is ``"all"``, and its own selection instead
    (``forms`` left out); it names its argument when one is not registered, a grid without an
    axis the family needs and a workload whose family is not registered, before any point
    runs."""
    grids = workloads.grids("roofline_step", "quick")
    assert all("forms" in g for g in grids)
    pts = kernels.points(grids, "gdn_step", seed=3, implementations="ring")
    assert pts and all("forms" not in p and p["seed"] == 3 for p in pts)
    assert {p["state_dtype"] for p in pts} == {"float32", "bfloat16"}
    every = kernels.points(grids, "gdn_step", seed=3)
    assert {p["forms"] for p in every} == {f for g in grids for f in g["forms"]}
    ran = []
    monkeypatch.setattr(kernels, "run_point", lambda fam, p, names: ran.append(names) or [])
    kernels.point_fn("gdn_step", ["ring"])(every[0])
    kernels.point_fn("gdn_step", ["ring"])(pts[0])
    assert ran == [every[0]["forms"], ("ring",)]
    with pytest.raises(ValueError, match=r"^grids: the gdn_decode family needs axis head_dim"):
        kernels.points([dict(B=[1], HK=[1], HV=[2], state_dtype=["float32"])], "gdn_decode",
                       seed=0)
    with pytest.raises(ValueError, match=r"^point: the gdn_decode family needs axis head_dim"):
        run_point("gdn_decode", dict(B=1, HK=1, HV=2, state_dtype="float32"), "decode")
    monkeypatch.setattr(workloads, "family", lambda name: "gdn_decod")
    with pytest.raises(ValueError, match=r"names family 'gdn_decod', which is not registered"):
        kernels.setup("gdn_decode", "all", grids="whatever")
    monkeypatch.undo()
    names, _ = kernels.setup("gdn_step", "ring+ring_exact_fold", grids="roofline_step")
    assert names == ["ring", "ring_exact_fold"]
    with pytest.raises(ValueError, match=r"^implementations: no implementation registered"):
        kernels.setup("gdn_decode", "my_decod")


@pytest.mark.parametrize("change, message", [
    (dict(ring_length=[2]), r"^grids: ring_length: must be one of \(8, 16, 32\), got 2"),
    (dict(HK=[2], HV=[3]), r"^grids: HV: must be a multiple of HK = 2, got 3"),
])
def test_a_step_sweep_refuses_what_no_form_runs_before_any_point(no_build, change, message):
    """The sweep's grid expansion refuses it (the whole sweep), not each point as it runs."""
    from pmll_lab.experiments import step

    grid = {k: [v] for k, v in STEP.items() if k != "alpha"}
    with pytest.raises(ValueError, match=message):
        step.points([{**grid, **change}], alpha=0.5, seed=0)


def test_a_head_size_the_ring_cannot_tile_is_an_unsupported_row(no_build):
    """Head size 20 (not a multiple of 16): the ring forms give "unsupported" rows naming the
    head size; nothing is built."""
    rows = run_point("gdn_step", {**STEP, "head_dim": 20}, "ring+ring_exact_fold")
    assert {r["status"] for r in rows} == {"unsupported"}
    assert {r["form"] for r in rows} == {"ring", "ring_exact_fold"}
    assert all("head size 20" in r["note"] for r in rows)


def test_a_conv_sweep_refuses_a_dtype_the_conv_kernels_do_not_take():
    from pmll_lab.experiments import conv

    with pytest.raises(ValueError, match=r"^grids: axis dtype: 'float16' is not one of "
                                         r"float32, bfloat16"):
        conv.points([{"K": [1], "B": [1], "shape": ["hk2-hv4-32"], "dtype": ["float16"]}])


def test_a_syntax_error_in_workloads_toml_names_the_file(tmp_path, monkeypatch):
    bad = tmp_path / "workloads.toml"
    bad.write_text("[gdn_decode]\nfamily = \"gdn_decode\"\n[[gdn_decode.quick]]\nB = [1,\n")
    monkeypatch.setattr(workloads, "PATH", bad)
    workloads.load.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"^workloads: .*workloads\.toml: "):
            workloads.grids("gdn_decode", "quick")
    finally:
        workloads.load.cache_clear()


def test_the_catalog_says_where_each_name_is_registered():
    """``registry.table()`` (printed by ``python -m pmll_lab.harness``): every registered name
    once, with the module whose ``register`` call made it."""
    import subprocess
    import sys

    rows = registry.table()
    assert sorted(r["name"] for r in rows) == sorted(registry.names())
    where = {r["name"]: r["module"] for r in rows}
    assert where["ring"] == "pmll_lab.harness.step_forms"
    assert where["ring_exact_fold"] == "pmll_lab.harness.step_ring_exact_fold"
    assert where["sglang_exact_fold"] == "pmll_lab.harness.step_sglang"
    out = subprocess.run([sys.executable, "-m", "pmll_lab.harness"], capture_output=True,
                         text=True, check=True, env={**__import__("os").environ,
                                                     "PMLL_LAB_DEVICE": "cpu"}).stdout
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["name", "family"] and len(lines) == len(rows) + 1


def test_the_listing_loads_plugins_and_takes_one_family(tmp_path):
    """``python -m pmll_lab.harness`` lists a plugin's implementation (``$PMLL_LAB_PLUGINS``),
    ``--family`` keeps one family's, and an unknown family, an unknown flag or a plugin that
    does not load is an error naming it (exit 2)."""
    import os
    import subprocess
    import sys

    plugin = tmp_path / "zz_plugin.py"
    plugin.write_text(
        "from pmll_lab.harness.decode import decode_run\n"
        "from pmll_lab.harness.registry import Implementation, register\n"
        "register(Implementation(name='zz_decode', family='gdn_decode', label='zz', "
        "provider='yours', impl='torch', build=decode_run(lambda *a, **k: None)))\n")
    env = {**os.environ, "PMLL_LAB_DEVICE": "cpu", "PMLL_LAB_PLUGINS": str(plugin)}

    def listing(*args, **over):
        return subprocess.run([sys.executable, "-m", "pmll_lab.harness", *args],
                              capture_output=True, text=True, env={**env, **over})

    got = listing("--family", "gdn_decode")
    names = [line.split()[0] for line in got.stdout.splitlines()[1:]]
    assert "pmll_lab_plugin_zz_plugin" in got.stdout, got.stdout
    assert got.returncode == 0 and names == ["decode", "decode_cuda", "flashinfer_decode",
                                             "zz_decode"], got
    joined = listing("--family", "roofline_verify").stdout      # with those joined to it
    assert "flashinfer_decode" in joined and "roofline_verify (joined from gdn_decode)" in joined
    for args, said in ((["--family", "gdn_decod"], "--family: no family 'gdn_decod'"),
                       (["--bogus"], "unrecognized arguments: --bogus")):
        got = listing(*args)
        assert got.returncode == 2 and said in got.stderr, got.stderr
    (tmp_path / "broken.py").write_text("def f(:\n")
    got = listing(PMLL_LAB_PLUGINS=str(tmp_path / "broken.py"))
    assert got.returncode == 2 and "raised SyntaxError" in got.stderr, got.stderr


def _with_toml(tmp_path, monkeypatch, text):
    path = tmp_path / "workloads.toml"
    path.write_text(text)
    monkeypatch.setattr(workloads, "PATH", path)
    workloads.load.cache_clear()


def test_a_grid_names_a_set_of_its_workload(tmp_path, monkeypatch):
    """``providers = "few"`` takes the list of the workload's ``sets`` table; a set it lacks is
    a ``ValueError`` naming the set and the ones there are."""
    _with_toml(tmp_path, monkeypatch, '[w]\nnotebook = "x"\n[w.sets]\nfew = ["a", "b"]\n'
               '[[w.quick]]\nB = [1, 2]\nproviders = "few"\n[[w.full]]\nproviders = "many"\n')
    try:
        assert workloads.grids("w", "quick") == [{"B": [1, 2], "providers": ["a", "b"]}]
        assert workloads.points("w", "quick") == [
            {"B": 1, "providers": "a"}, {"B": 1, "providers": "b"},
            {"B": 2, "providers": "a"}, {"B": 2, "providers": "b"}]
        with pytest.raises(ValueError, match=r"axis providers is a string, so it names a list "
                                             r"of the workload's sets table, which has no "
                                             r"'many' \(few\)"):
            workloads.grids("w", "full")
        assert workloads.presets("w") == ["full", "quick"]
    finally:
        workloads.load.cache_clear()


def test_the_roofline_grids_take_the_provider_set_as_a_list():
    grids = workloads.grids("roofline", "full")
    named = [g["providers"] for g in grids if "providers" in g]
    assert all(isinstance(p, list) and p for p in named)
    assert named.count(workloads.load()["roofline"]["sets"]["extra_shapes"]) == 3


def test_points_listed_one_by_one_are_the_runs_they_were():
    """The runs the carry_protocol, carry_step and spec_decode notebooks list one by one, as
    their parameters cells wrote them before they moved into workloads.toml."""
    from pmll_lab.experiments.protocol import pick_points

    full = [{"form": "exact", "L": 2, "S": 64, "HK": 4, "HV": 8, "head_dim": 128, "dtype": dtype,
             "K": 4, "steps": 8, "widths": [2, 16, 4, 32, 8, 1], "p_zero": 0.05,
             "state_layout": layout}
            for layout in ("kv", "vk") for dtype in ("bfloat16", "float32")]
    assert pick_points("carry_protocol_runs", "full") == full
    quick = pick_points("carry_protocol_runs", "quick")
    assert [(p["dtype"], p["K"], p["widths"], p["state_layout"]) for p in quick] == [
        ("bfloat16", 4, [1, 4, 2, 5, 3], "kv"), ("float32", 4, [4, 5, 1, 5, 4, 2], "kv"),
        ("bfloat16", 3, [1, 3, 2], "vk")]
    assert pick_points("carry_drift", "full") == [
        {"batch": 4, "steps": 1390, "rows": 4, "num_k_heads": 16, "num_v_heads": 32,
         "head_dim": 128, "checkpoints": 8, "ring_length": 16}]
    oracle, = pick_points("spec_decode_oracle", "full")
    assert oracle["forms"] == ["exact", "chain"] and oracle["arch"] == "qwen3_next_sized"
    # a dict in the parameters cell: a point or a list of points per preset
    assert pick_points({"quick": {"B": 1}, "full": []}, "quick") == [{"B": 1}]
    with pytest.raises(ValueError, match=r"^preset: 'huge' is not one of \['full', 'quick'\]"):
        pick_points({"quick": [], "full": []}, "huge", "drift_points")


@pytest.mark.parametrize("text, message", [
    ('[w]\nnotebook = "x"\n[[w.quik]]\nB = [1]\n', r"unknown key quik"),
    ('[w]\nnotebok = "x"\n[[w.quick]]\nB = [1]\n', r"unknown key notebok"),
    ('[w]\n[[w.quick]]\nB = [1]\n', r"needs one of family = \.\.\. or notebook"),
    ('[w]\nnotebook = "x"\nquick = 3\n', r"quick must be a list of grids"),
])
def test_a_misspelt_workload_key_is_refused(tmp_path, monkeypatch, text, message):
    """A misspelt preset (``[[w.quik]]``) or key would drop its grids without a word."""
    _with_toml(tmp_path, monkeypatch, text)
    try:
        with pytest.raises(ValueError, match=r"^workload 'w' in workloads\.toml: " + message):
            workloads.grids("w", "quick")
    finally:
        workloads.load.cache_clear()


def test_points_refuse_a_typo_a_bad_value_and_a_grid_before_any_run():
    from pmll_lab.experiments import carry, step
    from pmll_lab.experiments.protocol import pick_points

    drift = {"batch": 2, "steps": 4, "rows": 3, "num_k_heads": 1, "num_v_heads": 2,
             "head_dim": 16, "checkpoints": 2, "ring_length": 8}
    with pytest.raises(ValueError, match=r"^drift_points: point 0: unknown key setps"):
        pick_points({"quick": dict(drift, setps=4)}, "quick", "drift_points", step.DRIFT_KEYS)
    with pytest.raises(ValueError, match=r"^drift_points: point 0: steps: must be an int >= 1"):
        pick_points({"quick": dict(drift, steps=-3)}, "quick", "drift_points", step.DRIFT_KEYS)
    run, = pick_points("carry_protocol_runs", "full", "p", carry.PROTOCOL_KEYS)[:1]
    with pytest.raises(ValueError, match=r"^protocol_points: point 0: K: must be an int >= 1, "
                                         r"got \[4\]"):
        pick_points({"quick": [dict(run, K=[4])]}, "quick", "protocol_points",
                    carry.PROTOCOL_KEYS)
    with pytest.raises(ValueError, match=r"^protocol_points: point 0: missing key widths"):
        pick_points({"quick": [{k: v for k, v in run.items() if k != "widths"}]}, "quick",
                    "protocol_points", carry.PROTOCOL_KEYS)


def test_grids_and_points_refuse_value_heads_that_key_heads_do_not_divide():
    from pmll_lab.experiments.protocol import grid_points

    with pytest.raises(ValueError, match=r"^grids: HV: must be a multiple of HK = 2, got 3"):
        grid_points([{"HK": [2], "HV": [3]}])
    with pytest.raises(ValueError, match=r"^HV: must be a multiple of HK = 2, got 3"):
        run_point("gdn_decode", dict(DECODE, HK=2, HV=3), ["decode"])
    with pytest.raises(ValueError,
                       match=r"^state_dtype: one of float32, bfloat16, float16, got torch\."):
        run_point("gdn_decode", dict(DECODE, state_dtype=torch.float32), ["decode"])
    with pytest.raises(ValueError, match=r"^point: must be a dict"):
        run_point("gdn_decode", [1, 2], ["decode"])


def test_a_preset_given_one_grid_instead_of_a_list_is_refused():
    from pmll_lab.experiments.protocol import pick

    with pytest.raises(ValueError, match=r"^grids\['quick'\]: must be a list of grids, got one "
                                         r"dict"):
        pick({"quick": {"K": [2]}, "full": []}, "quick")


def test_the_kernels_notebook_passes_its_selection_to_the_points():
    """The kernels notebook gives ``KN.points`` its ``implementations``, so a selection of its
    own runs at a step workload's points instead of the workload's ``forms``."""
    import ast
    import json

    from _paths import ROOT
    cells = json.loads((ROOT / "notebooks/kernels.ipynb").read_text())["cells"]
    calls = [n for c in cells if c["cell_type"] == "code"
             for n in ast.walk(ast.parse("".join(c["source"]))) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "points"]
    assert calls and all(any(k.arg == "implementations" for k in c.keywords) for c in calls)


def test_a_plugin_that_replaces_its_own_name_registered_something(tmp_path):
    """A second plugin file re-registering a name of the first with ``replace=True`` (a new
    version of one's kernel) counts as registering."""
    text = ("from pmll_lab.harness.decode import decode_run\n"
            "from pmll_lab.harness.registry import Implementation, register\n"
            "register(Implementation(name='zz_v', family='gdn_decode', label='{}', "
            "provider='yours', impl='torch', build=decode_run(lambda *a, **k: None)), "
            "replace=True)\n")
    for v in ("v1", "v2"):
        (tmp_path / f"p_{v}.py").write_text(text.format(v))
    try:
        registry.load_plugins([str(tmp_path / "p_v1.py"), str(tmp_path / "p_v2.py")])
        assert registry.get("zz_v").label == "v2"
    finally:
        registry.IMPLEMENTATIONS.pop("zz_v", None)
        registry.MEMBERS["gdn_decode"].remove("zz_v")


def test_the_kernels_notebook_refuses_a_dtype_the_kernels_do_not_take():
    """float64 is the references' precision: a grid naming it as the inputs' dtype is refused
    by the kernels notebook's points, naming the axis, before any point runs."""
    grid = {k: [v] for k, v in DECODE.items()}
    assert kernels.points([grid], "gdn_decode", seed=0)
    with pytest.raises(ValueError, match=r"^grids: axis dtype: 'float64' is not one of"):
        kernels.points([dict(grid, dtype=["float64"])], "gdn_decode", seed=0)


def test_the_kernels_headline_counts_what_a_workloads_forms_run():
    """Where every point names its forms, the implementations run are those forms, not every
    registered one; a point without forms runs the notebook's own selection."""
    every = kernels.points(workloads.grids("roofline_step", "quick"), "gdn_step", seed=0)
    names = registry.names("gdn_step")
    ran = kernels.ran("gdn_step", names, every)
    assert set(ran) == {n for p in every for n in p["forms"].split("+")} < set(names)
    assert ran == [n for n in names if n in ran]
    assert kernels.ran("gdn_step", ["ring"], [dict(every[0], forms=None)]) == ["ring"]


def test_an_exact_step_form_without_its_plain_decoding_is_refused():
    """An exact ``gdn_step`` form is checked against plain decoding to the bit, so it must give
    ``plain``; registering one without is refused, naming ``plain``."""
    from pmll_lab.harness import step_forms as SF
    from pmll_lab.harness.registry import Implementation

    bad = Implementation(name="test_exact_no_plain", family="gdn_step", label="x",
                         provider="yours", impl="torch", exact=True, build=SF.build_plain)
    with pytest.raises(ValueError, match=r"^plain: an exact gdn_step implementation gives "):
        registry.register(bad)
    assert "test_exact_no_plain" not in registry.IMPLEMENTATIONS
    assert all(registry.get(n).plain for n in registry.names("gdn_step", exact=True))


@pytest.mark.parametrize("field", ["supports", "available"])
def test_a_supports_or_available_that_answers_a_bool_reads_failed(field):
    """``supports``/``available`` return None or a reason; ``lambda c: c.head_dim >= 16``
    returns True, which would read as a reason and skip the kernel unchecked: its row fails,
    naming the field, while the others run."""
    from pmll_lab.harness.decode import DECODE as OURS
    from pmll_lab.harness.registry import Implementation

    answer = (lambda c: True) if field == "supports" else (lambda: True)
    registry.register(Implementation(name="test_bool_answer", family="gdn_decode", label="x",
                                     provider="yours", impl="torch", build=OURS.build,
                                     **{field: answer}), replace=True)
    try:
        rows = run_point("gdn_decode", DECODE, ["decode", "test_bool_answer"])
    finally:
        registry.unregister("test_bool_answer")
    (bad,) = [r for r in rows if r["kernel"] == "test_bool_answer"]
    assert bad["status"] == "failed" and bad["passed"] is False
    assert f"{field}: must return None (it runs) or the reason it does not (a non-empty str), " \
        "got True" in bad["error"]
    assert all(r["passed"] for r in rows if r["kernel"] == "decode" and r["metric"] == "rel_l2")


def test_a_resumed_kernels_run_runs_a_point_again_when_what_runs_there_changed(tmp_path,
                                                                                monkeypatch):
    """The implementations run at a point, and the bytes of the plugin files, are part of the
    point: a plugin added or edited, or another selection, gives new point ids (a resumed run
    runs them), while the same selection and files give the same ids."""
    from pmll_lab.results import point_id

    monkeypatch.delenv(registry.PLUGINS_ENV, raising=False)
    pts = kernels.points([{k: [v] for k, v in DECODE.items()}], "gdn_decode", seed=0)
    ids = lambda ps: [point_id(p) for p in ps]                          # noqa: E731
    plain = kernels.bind(pts, ["decode"])
    assert plain[0]["forms"] == "decode" and "plugins" not in plain[0]
    assert ids(kernels.bind(pts, ["decode"])) == ids(plain)
    assert ids(kernels.bind(pts, ["decode", "mine"])) != ids(plain)
    f = tmp_path / "mine.py"
    f.write_text("# v1\n")
    v1 = kernels.bind(pts, ["decode"], [str(f)])
    f.write_text("# v2\n")
    v2 = kernels.bind(pts, ["decode"], [str(f)])
    assert len({*ids(plain), *ids(v1), *ids(v2)}) == 3
    monkeypatch.setenv(registry.PLUGINS_ENV, str(f))
    assert ids(kernels.bind(pts, ["decode"])) == ids(v2)
    monkeypatch.delenv(registry.PLUGINS_ENV)
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / "mine.py"           # the same file in another clone
    moved.write_bytes(f.read_bytes())
    assert ids(kernels.bind(pts, ["decode"], [str(moved)])) == ids(v2)
    assert ids(kernels.bind(pts, ["decode"], moved)) == ids(v2)      # a Path, as load_plugins
    grid_forms = kernels.bind([dict(pts[0], forms="decode+decode_cuda")], ["decode"])
    assert grid_forms[0]["forms"] == "decode+decode_cuda"


def test_an_empty_reason_is_refused():
    """``""`` would read as "it runs" though a reason was meant: the row fails, naming it."""
    from pmll_lab.harness.decode import DECODE as OURS
    from pmll_lab.harness.registry import Implementation

    registry.register(Implementation(name="test_empty_reason", family="gdn_decode", label="x",
                                     provider="yours", impl="torch", build=OURS.build,
                                     supports=lambda c: ""), replace=True)
    try:
        (bad,) = [r for r in run_point("gdn_decode", DECODE, ["test_empty_reason"])]
    finally:
        registry.unregister("test_empty_reason")
    assert bad["status"] == "failed" and "supports: must return None" in bad["error"]
    assert "got ''" in bad["error"]


def test_a_conv_step_point_with_a_non_numeric_alpha_is_refused_naming_it(no_build):
    with pytest.raises(ValueError, match=r"^alpha: the per-draft acceptance probability"):
        run_point("conv_step", {**STEP, "alpha": "0.5x"}, registry.names("conv_step"))


@pytest.mark.parametrize("field, answer, message", [
    ("bytes", lambda c, f: 1 / 0, "^RuntimeError: bytes: ZeroDivisionError"),
    ("bytes", lambda c, f: -5, r"bytes: .*must return a whole number of bytes in \[0, 2\*\*62\] "
                               r"\(or None\), got -5"),
    ("bytes", lambda c, f: float("nan"), "bytes: .*must return a whole number .* got nan"),
    ("bytes", lambda c, f: "64", "bytes: .*must return a whole number .* got '64'"),
    ("bytes", lambda c, f: 1e30, "bytes: .*must return a whole number .* got 1e\\+30"),
    ("version", lambda: 1 / 0, "version: ZeroDivisionError"),
    ("version", lambda: 5, "version: ValueError: must return a str \\(or None\\), got 5"),
    ("version", lambda: ["1.0"], "version: ValueError: must return a str .* got \\['1.0'\\]"),
])
def test_a_bytes_or_version_that_misbehaves_is_its_own_failed_row(field, answer, message):
    """A researcher's ``bytes``/``version`` that raises or answers nonsense fails its own row;
    the point's other implementations keep theirs (checked, and timed on a GPU)."""
    from pmll_lab.harness.decode import DECODE as OURS
    from pmll_lab.harness.registry import Implementation

    registry.register(Implementation(name="test_bad_field", family="gdn_decode", label="x",
                                     provider="yours", impl="torch", build=OURS.build,
                                     **{field: answer}), replace=True)
    try:
        rows = run_point("gdn_decode", DECODE, ["decode", "test_bad_field"])
    finally:
        registry.unregister("test_bad_field")
    bad = [r for r in rows if r["kernel"] == "test_bad_field" and r["status"] == "failed"]
    assert len(bad) == 1 and __import__("re").search(message, bad[0]["error"]), bad
    assert not [r for r in rows if r["kernel"] == "test_bad_field" and r["status"] == "ok"
                and r.get("metric") in ("time_us", "bytes_moved")]
    mine = [r for r in rows if r["kernel"] == "decode" and r["metric"] == "rel_l2"]
    assert mine and all(r["passed"] for r in mine)


@pytest.mark.parametrize("fields, message", [
    (dict(gpu_only="False"), r"^gpu_only: True or False, got 'False'"),
    (dict(exact="no"), r"^exact: True or False, got 'no'"),
    (dict(exact=None), r"^exact: True or False, got None"),
    (dict(supports=True), r"^supports: a function or None, got True"),
    (dict(available="yes"), r"^available: a function or None, got 'yes'"),
    (dict(version="0.1"), r"^version: a function or None, got '0.1'"),
    (dict(bytes=64), r"^bytes: a function or None, got 64"),
])
def test_an_implementation_with_a_field_of_the_wrong_kind_is_refused(fields, message):
    from pmll_lab.harness.decode import DECODE as OURS
    from pmll_lab.harness.registry import Implementation

    with pytest.raises(ValueError, match=message):
        Implementation(name="test_field", family="gdn_decode", label="x", provider="yours",
                       impl="torch", build=OURS.build, **fields)


def test_your_implementation_is_not_replaced_by_one_claiming_to_be_ours():
    from pmll_lab.harness.decode import DECODE as OURS
    from pmll_lab.harness.registry import Implementation

    mine = dict(name="test_claim", family="gdn_decode", label="x", impl="torch", build=OURS.build)
    registry.register(Implementation(provider="yours", **mine), replace=True)
    try:
        with pytest.raises(ValueError, match=r"^provider: 'test_claim' replaces your own"):
            registry.register(Implementation(provider="pmll_lab", **mine), replace=True)
        assert registry.get("test_claim").provider == "yours"
    finally:
        registry.unregister("test_claim")


def test_a_step_form_whose_version_raises_keeps_its_form_in_the_failed_row():
    """A step family's rows carry ``form`` (the step tables group by it): the failed row of a
    form whose ``version`` raises has it, so the failure shows in those tables."""
    from pmll_lab.harness.registry import Implementation

    ring = registry.get("ring")
    registry.register(Implementation(name="test_bad_version", family="gdn_step", label="x",
                                     provider="yours", impl="torch", build=ring.build,
                                     version=lambda: 1 / 0), replace=True)
    try:
        rows = run_point("gdn_step", STEP, ["test_bad_version"])
    finally:
        registry.unregister("test_bad_version")
    (bad,) = rows
    assert bad["status"] == "failed" and bad["form"] == "test_bad_version"
    assert bad["peer_version"] is None and "version: ZeroDivisionError" in bad["error"]


def test_bytes_may_be_a_one_element_integer_tensor():
    from pmll_lab.harness.decode import DECODE as OURS
    from pmll_lab.harness.registry import Implementation

    registry.register(Implementation(name="test_tensor_bytes", family="gdn_decode", label="x",
                                     provider="yours", impl="torch", build=OURS.build,
                                     bytes=lambda c, f: torch.tensor(4096)), replace=True)
    try:
        rows = run_point("gdn_decode", DECODE, ["test_tensor_bytes"])
    finally:
        registry.unregister("test_tensor_bytes")
    (b,) = [r for r in rows if r["metric"] == "bytes_moved"]
    assert b["value"] == 4096 and type(b["value"]) is int and b["status"] == "ok"
