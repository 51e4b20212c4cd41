# pmll_lab: the two commands of README.md, each doing its own set-up on a fresh machine.
#
#   make report   bootstrap, then run every notebook (quick preset) -> reports/latest/index.html
#                 (WORKERS=N: the sweeps on a local Dask cluster, one worker per GPU or N CPU
#                 workers; SCHEDULER=tcp://host:8786: on a running Dask cluster)
#   make test     bootstrap, then pytest
#   make lab      bootstrap + the lab extra, then JupyterLab at the project root (notebooks/ and
#                 reports/ both reachable; --allow-root when run as root; LAB_ARGS="--no-browser
#                 --port 8888 ..." adds JupyterLab options); it prints the URL with its token
#   make clean    remove reports/latest and caches (make distclean also removes .venv)
#
# Bootstrap (once; the stamp file .venv/.pmll_lab-installed makes later calls instant until
# pyproject.toml changes): create .venv if missing. If the system python already has torch
# with CUDA (a GPU machine), the venv is made with --system-site-packages and that torch and
# triton are kept (pinned by a constraints file so pip never replaces them); a .pth file also
# adds that python's own site-packages, for images whose python3 is itself a virtualenv (its
# packages are not "system site packages" then). Otherwise torch is installed first from
# $(TORCH_PIP) (the CPU build, which lies on local disk on this project's machines). Then the
# package in editable mode with its dev and dist (Dask distributed) extras, and SGLang's three
# GDN kernel files (the peer; scripts/fetch-sglang.sh, .sgl/, git-ignored) where pip can download.
#
# Variables: PRESET=quick|full  DEVICE=auto|cpu|cuda  RUN=latest  ONLY="name ..."
#            WORKERS=N  SCHEDULER=ADDRESS  REPORT_ARGS="--resume ..."  PYTEST_ARGS="-x -q ..."
#            LAB_ARGS="--no-browser ..."  PYTHON=python3

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.pmll_lab-installed
LAB_STAMP := $(VENV)/.pmll_lab-lab-installed
GPU_PINS := $(VENV)/.gpu-constraints.txt
TORCH_PIP ?= torch==2.13.0
PRESET ?= quick
DEVICE ?= auto
RUN ?= latest
ONLY ?=
WORKERS ?=
SCHEDULER ?=
REPORT_ARGS ?=
PYTEST_ARGS ?=
LAB_ARGS ?=
# JupyterLab refuses to start as root unless told: root (a container, CI) gets --allow-root
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

# "-c .venv/.gpu-constraints.txt" on a GPU venv: keep the system's torch and triton.
PINS = $$([ -f $(GPU_PINS) ] && echo "-c $(GPU_PINS)" || true)

.PHONY: report test lab install clean distclean

report: $(STAMP)
	$(PY) -m pmll_lab report --preset $(PRESET) --device $(DEVICE) --run $(RUN) \
		$(if $(strip $(ONLY)),--only $(ONLY)) $(if $(strip $(WORKERS)),--workers $(WORKERS)) \
		$(if $(strip $(SCHEDULER)),--scheduler $(SCHEDULER)) $(REPORT_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml
	@set -euo pipefail; \
	if [ ! -x "$(PY)" ]; then \
	  if $(PYTHON) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
	      >/dev/null 2>&1; then \
	    echo "bootstrap: $(PYTHON) has torch with CUDA: $(VENV) uses its torch and triton"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	    $(PYTHON) -c 'import site; print("\n".join(site.getsitepackages()))' \
	      > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_pmll_lab_system.pth"; \
	    $(PY) -c 'import torch, triton; print(f"torch=={torch.__version__}\ntriton=={triton.__version__}")' \
	      > $(GPU_PINS); \
	  else \
	    echo "bootstrap: no CUDA torch on $(PYTHON): $(VENV) gets the CPU build ($(TORCH_PIP))"; \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi; \
	if [ ! -f $(GPU_PINS) ] && ! $(PY) -c 'import torch' >/dev/null 2>&1; then \
	  echo "bootstrap: pip install $(TORCH_PIP)"; \
	  $(PIP) install -q $(TORCH_PIP); \
	fi; \
	echo "bootstrap: pip install -e '.[dev,dist]'"; \
	$(PIP) install -q $(PINS) -e '.[dev,dist]'; \
	if [ ! -f .sgl/VERSION ]; then \
	  echo "bootstrap: SGLang's three kernel files into .sgl (scripts/fetch-sglang.sh)"; \
	  PYTHON=$(PY) bash scripts/fetch-sglang.sh >/dev/null || \
	    echo "bootstrap: SGLang's kernels not fetched: its rows say 'SGLang: not installed'"; \
	fi; \
	touch $@

$(LAB_STAMP): $(STAMP)
	$(PIP) install -q $(PINS) -e '.[dev,dist,lab]'
	touch $@

lab: $(LAB_STAMP)
	@echo "lab: JupyterLab on $(CURDIR) (notebooks/, reports/); open the URL with its token" \
		"printed below (again later: $(VENV)/bin/jupyter server list)"
	$(PY) -m jupyter lab --ServerApp.root_dir="$(CURDIR)" $(LAB_ROOT_FLAG) $(LAB_ARGS)

clean:
	rm -rf reports/latest .pytest_cache .hypothesis build *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
