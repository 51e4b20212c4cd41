#!/usr/bin/env bash
# One notebook's full preset on 2 GPUs (Dask LocalCluster, --workers 2) and then on 1 GPU
# (in-process), each with its own empty Triton cache so both pay the same compilation, as a
# fresh run does. Writes both runs under reports/RUN/{2gpu,1gpu}, the wall times to
# reports/RUN/scaling.txt, and packs reports/RUN into $OUT/RUN.tgz.
# Usage (device machine with >= 2 GPUs, repo root, .whl with scripts/wheels-dist.txt carried):
#   PMLL_LAB_COMMIT=<sha> bash scripts/dist_scaling.sh RUN NOTEBOOK [SECONDS]
set -u
run=$1; nb=$2; limit=${3:-280}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD JUPYTER_PATH=/tmp/site/share/jupyter PATH=/tmp/site/bin:$PATH
python3 -m ipykernel install --user --name python3 >/dev/null || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv
mkdir -p "reports/$run"
for gpus in 2 1; do
  export TRITON_CACHE_DIR=/tmp/triton-cache-$gpus
  rm -rf "$TRITON_CACHE_DIR"
  extra=(); [ "$gpus" -gt 1 ] && extra=(--workers "$gpus")
  t0=$(date +%s.%N)
  timeout "$limit" python3 -m pmll_lab report --preset full --device cuda --only "$nb" \
    --reports-dir "reports/$run" --run "${gpus}gpu" "${extra[@]}"
  rc=$?
  t1=$(date +%s.%N)
  echo "$nb gpus=$gpus rc=$rc wall_s=$(python3 -c "print(round($t1-$t0,1))")" | tee -a "reports/$run/scaling.txt"
done
tar czf "$OUT/$run.tgz" -C reports "$run"
