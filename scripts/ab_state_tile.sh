#!/usr/bin/env bash
# The 2-byte state tile held widened (the default) against held as 2-byte pairs
# (PMLL_LAB_PACKED_STATE_TILE=1, reports/perf-notes.md "bf16 state pools"), on the H200 device
# machine, logs into $OUT/logs. The switch is fixed at import, so each side is its own process;
# every row records it (import_settings). Two parts, one call each (~5 min apiece):
#   bash scripts/ab_state_tile.sh timing      the step forms, both switches, B = 1, 64, 128,
#                                             bf16 / fp16 / fp32 pools; then 32 value rows per
#                                             verify program on the packed bf16 tile
#   bash scripts/ab_state_tile.sh exactness   the exactness grid under the packed switch, ten
#                                             processes side by side (bitwise or not, per config)
# Usage (device machine, repo root, .whl carried): PMLL_LAB_COMMIT=<sha> bash scripts/ab_state_tile.sh PART
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
case $part in
  timing)
    for packed in 0 1; do
      echo "== packed_state_tile=$packed $(date -u +%H:%M:%S)"
      PMLL_LAB_PACKED_STATE_TILE=$packed timeout 250 python3 scripts/bench_step.py --forms $forms \
        --states bfloat16,float16,float32 --batches 1,64,128 \
        --out "$OUT/logs/ab-tile-$packed.jsonl" 2>&1 | tee "$OUT/logs/ab-tile-$packed.log"
    done
    echo "== packed, 32 value rows per verify program $(date -u +%H:%M:%S)"
    PMLL_LAB_PACKED_STATE_TILE=1 timeout 80 python3 scripts/bench_step.py \
      --forms exact_lazy,exact_eager --states bfloat16 --batches 64,128 \
      --set "vk_tiles=((128, 8, 8, 1), (4611686018427387904, 8, 32, 1))" \
      --out "$OUT/logs/ab-tile-1-rows32.jsonl" 2>&1 | tee "$OUT/logs/ab-tile-1-rows32.log" ;;
  exactness)
    for d in 16 32 64 128 256; do
      for l in kv vk; do
        PMLL_LAB_PACKED_STATE_TILE=1 timeout 500 python3 -m pmll_lab.experiments.exactness \
          --head-dims $d --layouts $l --batch 32 --steps 12 \
          --out "$OUT/logs/exactness-packed-kd$d-$l.jsonl" > "$OUT/logs/exactness-packed-kd$d-$l.log" 2>&1 &
      done
    done
    wait
    tail -n 1 "$OUT"/logs/exactness-packed-*.log ;;
  *) echo "part: expected timing or exactness, got $part" >&2; exit 2 ;;
esac
