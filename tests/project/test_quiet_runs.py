"""A run that succeeds says nothing else; a bad parameter stops it naming the parameter.

- The Triton interpreter's own NumPy deprecation ("Conversion of an array with ndim > 0 to a
  scalar", thousands per test run) is filtered where it arises: in ``pmll_lab._interpreter``
  (outside pytest) and in ``pyproject.toml``'s pytest ``filterwarnings``; other warnings still
  show.
- The report's notebook kernels are shut down without a SIGINT (the interrupt that made an idle
  kernel log ``KeyboardInterrupt caught in kernel`` under a notebook that ran fine).
- papermill's injected parameters are checked against the parameters cell: a misspelt name
  (``-p presett full``) or a grid given as a number (``-p grids 3``) is a ``ValueError`` naming
  it, before anything runs.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
import tomllib
import warnings

import nbformat
import pytest
import torch

import pmll_lab  # noqa: F401  (first: picks GPU or the Triton interpreter)
import triton
import triton.language as tl
from pmll_lab._interpreter import INTERPRETER_WARNINGS
from pmll_lab.backend import INTERPRET
from pmll_lab.experiments import protocol as P
from pmll_lab.experiments.parameters import INJECTED_MARK, assigned, check_injected
from pmll_lab.report import REPO_ROOT

MESSAGE = INTERPRETER_WARNINGS[0][0]


@triton.jit
def _sum_first(x_ptr, n_ptr):
    n = tl.load(n_ptr)
    acc = 0.0
    for i in range(n):          # the interpreter converts n with int(): NumPy's deprecation
        acc += tl.load(x_ptr + i)
    tl.store(x_ptr, acc)


KERNEL = "import triton\nimport triton.language as tl\n\n\n" + inspect.getsource(_sum_first.fn)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's own warning")
def test_interpreter_deprecation_is_filtered_under_pytest():
    """The test session's filters (pyproject's ``filterwarnings``) drop the interpreter's
    deprecation; the kernel still computes its sum."""
    x = torch.arange(1.0, 6.0)
    with warnings.catch_warnings(record=True) as seen:   # the filters pytest set for this test
        _sum_first[(1,)](x, torch.tensor([3], dtype=torch.int32))
    assert x[0].item() == 6.0                            # 1 + 2 + 3
    assert not [w for w in seen if MESSAGE in str(w.message)], [str(w.message) for w in seen]


def test_pyproject_filter_is_the_interpreters_own():
    """The pytest filter names the same message, category and module as ``INTERPRETER_WARNINGS``
    (one warning, filtered in both places)."""
    cfg = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    lines = cfg["tool"]["pytest"]["ini_options"]["filterwarnings"]
    want = {f"ignore:{m}:{c.__name__}:{mod}" for m, c, mod in INTERPRETER_WARNINGS}
    assert want <= set(lines), (want, lines)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's own warning")
def test_interpreter_deprecation_is_filtered_outside_pytest_and_others_still_show(tmp_path):
    """A plain ``python -W default`` session that imports pmll_lab and runs an interpreted
    kernel prints no interpreter deprecation; a project warning and the same message from
    another module still print."""
    script = tmp_path / "run.py"
    script.write_text(
        "import warnings, torch\nimport pmll_lab\n" + KERNEL +
        "x = torch.arange(1.0, 6.0)\n_sum_first[(1,)](x, torch.tensor([3], dtype=torch.int32))\n"
        "print('SUM', float(x[0]))\n"
        "warnings.warn('a project warning', DeprecationWarning)\n"
        f"warnings.warn_explicit({MESSAGE!r} + ' (elsewhere)', DeprecationWarning, 'x.py', 1,"
        " module='pmll_lab.elsewhere')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PMLL_LAB_DEVICE="cpu")
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-W", "default", str(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "SUM 6.0" in proc.stdout
    assert "a project warning" in proc.stderr and "(elsewhere)" in proc.stderr
    assert proc.stderr.count(MESSAGE) == 1, proc.stderr        # the other module's only


def _params_notebook(path, body: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('preset = "quick"\ndevice = "auto"\nresults_dir = "results"\n'
                                       'seed = 0\ngrids = {"quick": [{"B": [1]}]}')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)


def _papermill(src, out, parameters, tmp_path):
    import papermill

    from pmll_lab.report_notebooks import KERNEL_NAME, kernel_environment

    with kernel_environment("cpu"):
        papermill.execute_notebook(str(src), str(out), parameters=parameters,
                                   kernel_name=KERNEL_NAME, language="python",
                                   progress_bar=False, log_output=False, cwd=str(tmp_path))


SIGINT_PROBE = '''
import os, signal
open("kernel.pid", "w").write(str(os.getpid()))
def _on_sigint(signum, frame):
    open("sigint.txt", "a").write("SIGINT\\n")
# the handler the kernel restores after this cell: it stays in place while the kernel idles
get_ipython().kernel.saved_sigint_handler = _on_sigint
'''


def test_report_kernels_shut_down_without_an_interrupt(tmp_path):
    """The report's kernel manager asks an idle kernel to shut down without sending it a
    SIGINT first (jupyter_client's default does, and a kernel inside a handler then logs
    "KeyboardInterrupt caught in kernel"), and the kernel process is gone afterwards."""
    from pmll_lab.report import build_report

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _params_notebook(nbdir / "probe.ipynb", SIGINT_PROBE)
    manifest = build_report(device="cpu", notebooks_dir=nbdir, reports_dir=tmp_path / "reports",
                            log=lambda m: None)
    assert manifest["ok"], manifest["notebooks"]
    pid = int((nbdir / "kernel.pid").read_text())
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not (nbdir / "sigint.txt").exists(), "the kernel got a SIGINT at shutdown"
    assert not os.path.exists(f"/proc/{pid}") or \
        open(f"/proc/{pid}/stat").read().split()[2] == "Z", "the kernel outlived its notebook"


def test_injected_parameters_are_checked_against_the_parameters_cell():
    """A misspelt name is refused naming it and the valid names; a dict parameter given as a
    number names the parameter; right names pass; no injected cell (Lab): nothing checked."""
    params = 'preset = "quick"\nseed = 0\ngrids = {"quick": []}\nsim_Ks = [2, 4]\nscheduler = None'
    assert assigned(params) == {"preset": None, "seed": None, "grids": "dict", "sim_Ks": "list",
                                "scheduler": None}
    run = ["", params, f'{INJECTED_MARK}\npresett = "full"\n', "T.setup()"]
    with pytest.raises(ValueError, match=r"^presett: not a parameter of this notebook \(its "
                                         r"parameters: preset, seed, grids, sim_Ks, scheduler\)"):
        check_injected(run, {"presett": "full"})
    run[2] = f"{INJECTED_MARK}\ngrids = 3\n"
    with pytest.raises(ValueError, match=r"^grids: must be a dict like the parameters cell's, "
                                         r"got int 3"):
        check_injected(run, {"grids": 3})
    run[2] = f'{INJECTED_MARK}\nsim_Ks = 4\n'
    with pytest.raises(ValueError, match="^sim_Ks: must be a list"):
        check_injected(run, {"sim_Ks": 4})
    run[2] = f'{INJECTED_MARK}\npreset = "full"\nseed = 3\nscheduler = "tcp://h:8786"\n' \
             'grids = {"full": []}\nsim_Ks = [8]\n'
    check_injected(run, {"preset": "full", "seed": 3, "scheduler": "tcp://h:8786",
                         "grids": {"full": []}, "sim_Ks": [8]})
    check_injected(["", params, "T.setup()"], {"presett": "full"})     # run by hand: no check


def test_pick_names_a_grid_that_is_not_a_dict():
    with pytest.raises(ValueError, match=r"^grids: must be a dict of presets .* got int 3"):
        P.pick(3, "quick")
    with pytest.raises(ValueError, match=r"^grids\['quick'\]: lists no grid"):
        P.pick({"quick": []}, "quick")
    with pytest.raises(ValueError, match=r"^step_grids: must be a dict"):
        P.pick([{"B": [1]}], "quick", "step_grids")


def test_a_notebook_refuses_a_misspelt_parameter_before_running(tmp_path):
    """Through papermill, as docs/setup.md runs a notebook by hand: ``presett`` stops the
    notebook in its setup call (``targets.setup``) with the parameter named, before the cell
    that would have run a sweep."""
    from papermill.exceptions import PapermillExecutionError

    body = ("from pmll_lab.experiments import targets as T\nT.setup()\n"
            "open('ran.txt', 'w').write('ran')\n")
    _params_notebook(tmp_path / "nb.ipynb", body)
    with pytest.raises(PapermillExecutionError) as err:
        _papermill(tmp_path / "nb.ipynb", tmp_path / "out.ipynb", {"presett": "full"}, tmp_path)
    assert err.value.ename == "ValueError"
    assert err.value.evalue.startswith("presett: not a parameter of this notebook (its "
                                       "parameters: preset, device, results_dir, seed, grids)")
    assert not (tmp_path / "ran.txt").exists()
    with pytest.raises(PapermillExecutionError) as err:
        _papermill(tmp_path / "nb.ipynb", tmp_path / "out.ipynb", {"grids": 3}, tmp_path)
    assert err.value.evalue.startswith("grids: must be a dict")
    with pytest.raises(PapermillExecutionError) as err:     # a value against its rule
        _papermill(tmp_path / "nb.ipynb", tmp_path / "out.ipynb", {"seed": -1}, tmp_path)
    assert err.value.evalue.startswith("seed: must be an int >= 0, got -1")
    assert not (tmp_path / "ran.txt").exists()
    _papermill(tmp_path / "nb.ipynb", tmp_path / "out.ipynb", {"preset": "full"}, tmp_path)
    assert (tmp_path / "ran.txt").read_text() == "ran"


def test_parameter_values_are_checked_naming_the_parameter():
    """``parameters.check_values`` (run by ``targets.setup`` before any sweep): each rule of
    ``PARAM_RULES`` names its parameter, ``mean_accept`` is held within ``[1, accept_K]``, and a
    sweep parameter given as a workload's name must name one."""
    from pmll_lab.experiments.parameters import PARAM_RULES, check_values

    good = dict(seed=0, mean_accept=3.3, accept_K=4, step_alpha=0.8, p_zero=0.0,
                lazy_min_seqs=8, eager_max_pending=4, sim_alphas=[0.2, 0.95], sim_Ks=[2, 8],
                main_K=4, main_p=0.8, alpha=0.8, grids="roofline", drift_points="carry_drift",
                step_grids={"quick": []}, wrap_capacity=8, wrap_segments=[5, 6])
    assert set(PARAM_RULES) <= set(good)
    check_values(good)
    for over, said in (
            (dict(mean_accept=5), r"^mean_accept: the mean accepted length of accept_K = 4 rows, "
                                  r"a number in \[1, 4\], got 5"),
            (dict(mean_accept="3,3"), r"^mean_accept: .* got '3,3'"),
            (dict(accept_K=0), r"^accept_K: must be an int >= 1, got 0"),
            (dict(accept_K="four"), r"^accept_K: must be an int >= 1, got 'four'"),
            (dict(step_alpha=1.5), r"^step_alpha: the per-draft acceptance .* in \(0, 1\)"),
            (dict(step_alpha=1.0), r"^step_alpha: the per-draft acceptance .* got 1.0"),
            (dict(alpha=0.0), r"^alpha: the per-draft acceptance .* got 0.0"),
            (dict(p_zero=2), r"^p_zero: must be a probability"),
            (dict(main_p=1.5), r"^main_p: must be a probability"),
            (dict(main_K=0), r"^main_K: must be an int >= 1, got 0"),
            (dict(lazy_min_seqs=-1), r"^lazy_min_seqs: must be an int >= 0, got -1"),
            (dict(eager_max_pending=-3), r"^eager_max_pending: must be an int >= 0"),
            (dict(sim_Ks=[0, 2, 4]), r"^sim_Ks: must be an int >= 1, got 0"),
            (dict(sim_alphas=[0.2, 1.5]), r"^sim_alphas: must be a probability"),
            (dict(seed="abc"), r"^seed: must be an int >= 0, got 'abc'"),
            (dict(step_grids="roofline_stpe"), r"^step_grids: workload: no workload "
                                               r"'roofline_stpe'"),
            (dict(drift_points="carry_drfit"), r"^drift_points: workload: no workload")):
        with pytest.raises(ValueError, match=said):
            check_values({**good, **over})
