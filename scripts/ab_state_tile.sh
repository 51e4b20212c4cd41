#!/usr/bin/env bash
# The import-time kernel switches against each other on the H200 device machine, logs into
# $OUT/logs (reports/perf-notes.md "bf16 state pools"): PMLL_LAB_PACKED_STATE_TILE (a 2-byte
# state tile held as 2-byte pairs between rows) and PMLL_LAB_COMPACT_QK (the row's q/k formed on
# their compact layout). Each switch is fixed at import, so each combination is its own process;
# every row records them (import_settings). Three parts, one device call each (~5 min apiece):
#   bash scripts/ab_state_tile.sh timing A    the step forms with switches off and packed on
#   bash scripts/ab_state_tile.sh timing B    compact on, both on, then 32 value rows per
#                                             verify program on the packed bf16 tile
#   bash scripts/ab_state_tile.sh exactness   the exactness grid with both switches on, ten
#                                             processes side by side (bitwise or not, per config)
# (forms exact_lazy, exact_eager, chain_restore; bf16 / fp16 / fp32 pools; B = 1, 64, 128)
# Usage (device machine, repo root, .whl carried): PMLL_LAB_COMMIT=<sha> bash scripts/ab_state_tile.sh PART [A|B]
set -u
part=${1:?timing or exactness}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
forms=exact_lazy,exact_eager,chain_restore
steps() {   # $1 packed, $2 compact
  echo "== packed_state_tile=$1 compact_qk=$2 $(date -u +%H:%M:%S)"
  PMLL_LAB_PACKED_STATE_TILE=$1 PMLL_LAB_COMPACT_QK=$2 timeout 250 python3 scripts/bench_step.py \
    --forms $forms --states bfloat16,float16,float32 --batches 1,64,128 \
    --out "$OUT/logs/ab-step-p$1-c$2.jsonl" 2>&1 | tee "$OUT/logs/ab-step-p$1-c$2.log"
}
case $part in
  timing)
    case ${2:-} in
      A) steps 0 0; steps 1 0 ;;
      B) steps 0 1; steps 1 1
         echo "== packed, 32 value rows per verify program $(date -u +%H:%M:%S)"
         PMLL_LAB_PACKED_STATE_TILE=1 timeout 80 python3 scripts/bench_step.py \
           --forms exact_lazy,exact_eager --states bfloat16 --batches 64,128 \
           --set "vk_tiles=((128, 8, 8, 1), (4611686018427387904, 8, 32, 1))" \
           --out "$OUT/logs/ab-step-p1-c0-rows32.jsonl" 2>&1 | tee "$OUT/logs/ab-step-p1-c0-rows32.log" ;;
      *) echo "timing: expected A or B, got '${2:-}'" >&2; exit 2 ;;
    esac ;;
  exactness)
    for d in 16 32 64 128 256; do
      for l in kv vk; do
        PMLL_LAB_PACKED_STATE_TILE=1 PMLL_LAB_COMPACT_QK=1 timeout 500 \
          python3 -m pmll_lab.experiments.exactness --head-dims $d --layouts $l --batch 32 \
          --steps 12 --out "$OUT/logs/exactness-p1-c1-kd$d-$l.jsonl" \
          > "$OUT/logs/exactness-p1-c1-kd$d-$l.log" 2>&1 &
      done
    done
    wait
    tail -n 1 "$OUT"/logs/exactness-p1-c1-*.log ;;
  *) echo "part: expected timing or exactness, got $part" >&2; exit 2 ;;
esac
