#!/usr/bin/env bash
# Run the notebooks' full preset on the H200 device machine and pack the run folder into $OUT.
# Usage (device machine, repo root, .whl carried):  bash scripts/h200_reports.sh RUN_NAME SECONDS NB[:SECONDS]...
# Each notebook gets a wall-clock limit (its own after a colon, else SECONDS); a notebook cut short
# keeps the sweep rows it finished. Set PMLL_LAB_COMMIT to the commit sent (the copy has no .git).
# FlashInfer is used when an earlier `bash .fi/fi-unpack.sh` unpacked it into /tmp/site.
# WORKERS=N (N >= 2) spreads each notebook's sweeps over N GPUs of the host (a Dask LocalCluster,
# `--workers N`): per-point graph-replay times agree across the GPUs of one host within ~1.5 %
# (reports/h200x2-2026-11-30b); gdn_verify's full sweep ran 1.93x faster on 2 GPUs than on 1.
# FlashInfer compiles a CuTe-DSL kernel per shape (2-6 s each) into ~/.cache/flashinfer; the
# script packs that cache into $OUT/fi-jit-cache.tgz, and a later session that carries it as
# .fi/jit-cache.tgz starts with it unpacked (FlashInfer reloads a kernel whose meta matches).
# REPORTS_DIR (default reports) is where the run folder is written: a folder outside the copied
# tree (e.g. /tmp/pmll-reports) keeps a run's finished notebooks and points across the calls of
# one warm machine, so a later call can add notebooks or --resume a cut one.
set -u
run=$1; limit=$2; shift 2
rdir=${REPORTS_DIR:-reports}
[ -f .fi/jit-cache.tgz ] && tar xzf .fi/jit-cache.tgz -C "$HOME"
# the wheels: installed when carried (a later call on the same warm machine may leave them
# out), once per machine (scripts/gpu_session.sh marks /tmp/site/.whl-done the same way)
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.whl-done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.whl-done || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD JUPYTER_PATH=/tmp/site/share/jupyter PATH=/tmp/site/bin:$PATH
# FlashInfer, when ../shared/device/fetch-flashinfer.sh's three parts were unpacked (fi-unpack.sh)
[ -f /tmp/site/.fi-ready ] && export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 -m ipykernel install --user --name python3 >/dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
for arg in "$@"; do
  nb=${arg%%:*}; lim=$limit; [ "$nb" != "$arg" ] && lim=${arg#*:}
  echo "== $nb $(date -u +%H:%M:%S)"
  extra=(); [ "${WORKERS:-1}" -gt 1 ] && extra=(--workers "$WORKERS")
  timeout "$lim" python3 -m pmll_lab report --preset full --device cuda --run "$run" --only "$nb" \
    --reports-dir "$rdir" --resume "${extra[@]}"
  echo "== $nb rc=$? $(date -u +%H:%M:%S)"
done
tar czf "$OUT/$run.tgz" -C "$rdir" "$run"
[ -d "$HOME/.cache/flashinfer" ] && tar czf "$OUT/fi-jit-cache.tgz" -C "$HOME" .cache/flashinfer
ls -la "$rdir/$run"
