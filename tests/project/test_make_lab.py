"""``make lab`` starts JupyterLab for anyone (``--allow-root`` as root), at the project root (so
``notebooks/`` and ``reports/`` are both reachable), with ``LAB_ARGS`` passed on, after saying
where the URL with its token is printed. Run through the real Makefile recipe with a stand-in
``python`` that records its arguments (the lab extra is not installed by ``make test``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from _paths import ROOT


@pytest.fixture()
def stub_venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text('#!/bin/sh\nprintf "ARG %s\\n" "$@"\n')
    py.chmod(0o755)
    for stamp in (".pmll_lab-installed", ".pmll_lab-lab-installed"):  # up to date: no pip
        (venv / stamp).touch()
        time.sleep(0.01)
    return venv


def test_make_lab_starts_at_the_project_root_with_lab_args(stub_venv):
    if shutil.which("make") is None:
        pytest.fail("make is needed (README's commands are make targets)")
    res = subprocess.run(["make", "-s", "lab", f"VENV={stub_venv}",
                          "LAB_ARGS=--no-browser --port 9999"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    args = [ln[4:] for ln in res.stdout.splitlines() if ln.startswith("ARG ")]
    assert args[:2] == ["-m", "jupyter"] and args[2] == "lab", args
    assert f"--ServerApp.root_dir={ROOT}" in args
    assert ("--allow-root" in args) == (os.getuid() == 0)
    assert args[-3:] == ["--no-browser", "--port", "9999"]
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("lab: ")]
    assert said and "URL with its token" in said[0] and "reports/" in said[0]


def test_make_n_lab_shows_the_command():
    res = subprocess.run(["make", "-n", "lab", "LAB_ARGS=--port 9998"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stdout.splitlines() if "-m jupyter lab" in ln]
    assert line and f'--ServerApp.root_dir="{ROOT}"' in line[-1]
    assert line[-1].rstrip().endswith("--port 9998")
    assert ("--allow-root" in line[-1]) == (os.getuid() == 0)
