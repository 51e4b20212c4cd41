#!/usr/bin/env bash
# One device session in four calls, back to back on the warm machine (it is given back ~30 s
# after a call ends), each carrying one FlashInfer part (../shared/device/fetch-flashinfer.sh,
# scripts/pack_flashinfer_next.sh), the wheels (.whl) and SGLang's kernel files (.sgl):
#   ab      carry .fi/part-a: the exact family's step with packed_state_tile off and on (one
#           process each; exact lazy/eager, chain + restore, plain decoding; bf16 and fp32
#           pools; B = 1, 64, 128), logs/ab-step-p{0,1}.*
#   exact   carry .fi/part-b: the exactness grid of the 2-byte pools with the shipped switches
#           (ten processes side by side) and SGLang's bitwise claim (its fold against its own
#           recurrent decode), logs/exactness-*, logs/sglang-exactness.*
#   steps   carry .fi/part-c.tar: FlashInfer unpacked; the carry_step notebook's full preset
#           (every step form against FlashInfer's and SGLang's, the drift study), packed into
#           $OUT/<run>.tgz by scripts/h200_reports.sh
#   next    carry .fi/part-d.tar: FlashInfer 0.7.4 beside 0.7.2.post1 on the ring and snapshot
#           steps (bench_step.py, one process per release, our ring in both), logs/fi-*
# Usage (device machine, repo root): PMLL_LAB_COMMIT=<sha> bash scripts/gpu_session.sh PART [RUN]
set -u
part=${1:?ab, exact, steps or next}
run=${2:-h200-$(date -u +%Y-%m-%d)}
[ -f .fi/fi-unpack.sh ] && bash .fi/fi-unpack.sh
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.whl-done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.whl-done || exit 1
fi
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD PYTHONUNBUFFERED=1
export JUPYTER_PATH=/tmp/site/share/jupyter PATH=/tmp/site/bin:$PATH
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/logs/device.txt"
case $part in
  ab)
    for p in 0 1; do
      echo "== packed_state_tile=$p $(date -u +%H:%M:%S)"
      PMLL_LAB_PACKED_STATE_TILE=$p timeout 200 python3 scripts/bench_step.py \
        --forms exact_lazy,exact_eager,chain_restore,plain_decode --states bfloat16,float32 \
        --batches 1,64,128 --out "$OUT/logs/ab-step-p$p.jsonl" 2>&1 | tee "$OUT/logs/ab-step-p$p.log"
    done ;;
  exact)
    for d in 16 32 64 128 256; do
      for l in kv vk; do
        timeout 330 python3 -m pmll_lab.experiments.exactness --head-dims $d --layouts $l \
          --state-dtypes bfloat16,float16 --batch 32 --steps 12 \
          --out "$OUT/logs/exactness-kd$d-$l.jsonl" > "$OUT/logs/exactness-kd$d-$l.log" 2>&1 &
      done
    done
    timeout 330 python3 -m pmll_lab.experiments.sglang_exactness --head-dims 64,128 \
      --out "$OUT/logs/sglang-exactness.jsonl" > "$OUT/logs/sglang-exactness.log" 2>&1 &
    wait
    tail -n 1 "$OUT"/logs/exactness-*.log; tail -n 4 "$OUT/logs/sglang-exactness.log"
    (cd "$OUT" && tar czf logs-exact.tgz logs && rm -rf logs) ;;
  steps)
    python3 -m ipykernel install --user --name python3 >/dev/null
    bash scripts/h200_reports.sh "$run" 560 carry_step:540 ;;
  next)
    [ -f .fi/fi-unpack-next.sh ] && bash .fi/fi-unpack-next.sh
    for site in /tmp/site /tmp/site-next; do
      tag=$(PYTHONPATH=$site:$PYTHONPATH python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null)
      echo "== FlashInfer $tag $(date -u +%H:%M:%S)"
      PYTHONPATH=$site:$PYTHONPATH timeout 240 python3 scripts/bench_step.py \
        --forms ring,flashinfer_replayssm,flashinfer_snapshot_restore --states bfloat16 \
        --batches 1,8,64,128,256 --out "$OUT/logs/fi-$tag.jsonl" 2>&1 | tee "$OUT/logs/fi-$tag.log"
    done ;;
  *) echo "part: expected ab, exact, steps or next, got $part" >&2; exit 2 ;;
esac
