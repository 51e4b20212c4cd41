#!/usr/bin/env bash
# One device session in four calls, back to back on the warm machine (it is given back ~30 s
# after a call ends), each carrying one FlashInfer part (../shared/device/fetch-flashinfer.sh,
# scripts/pack_flashinfer_next.sh), the wheels (.whl; .whlm: transformers for the model) and
# SGLang's kernel files (.sgl). Timings compared across calls come from one warm machine:
#   ab0     carry .fi/part-a: the exact family's step with packed_state_tile off (exact
#           lazy/eager, chain + restore, plain decoding; bf16 and fp32 pools; B = 1, 64, 128)
#   ab1     carry .fi/part-b: the same with it on (the shipped default)
#   steps   carry .fi/part-c.tar: FlashInfer unpacked; the carry_step notebook's full preset
#           (every step form against FlashInfer's and SGLang's, the drift study), packed into
#           $OUT/<run>.tgz by scripts/h200_reports.sh
#   last    carry .fi/part-d.tar and .whlm: FlashInfer 0.7.4 beside 0.7.2.post1 on the ring and
#           snapshot steps (one process per release, our ring in both) on a quiet GPU; then, side
#           by side (correctness and training, not timed): the exactness grid of the 2-byte pools
#           with the shipped switches, SGLang's bitwise claim, the tokens notebook's GPU model
# With less device time, one call without FlashInfer (one: the exactness grid, SGLang's bitwise
# claim, every other step form, then the packed tile off), or three calls: first (part-a: the exactness grid of the 2-byte pools and
# SGLang's bitwise claim), second (part-b: the A/B, exact lazy and plain decoding, bf16), steps.
# The notebooks' full preset in one run folder, over three sessions of 30 device-minutes (times
# on an H100: h100-2026-12-07f, and h100-2026-12-07r with every sequence checked against plain
# decoding, where carry_step took 516 + 112 s; a machine's start counts about 300 s; each
# part's limit leaves room under a call's 600 s). Session 1: n1 (part-a, .whl, .sgl: the whole
# exactness grid and SGLang's claim, 340 s), n2 (part-b), n3 (part-c.tar: carry_step, cut at
# 540 s), n4 (part-d.tar: FlashInfer's two releases, carry_step resumed). Session 2: n5
# (part-a, .whl: pmll_ring, gdn_conv), n6 (part-b: smoke), n7 (part-c.tar: roofline, cut at
# 540 s), n8 (roofline resumed, kernels). Session 3: n9 (part-a, .whl, .whlm: spec_decode,
# tokens), n10 (part-b), n11 (part-c.tar: gdn_verify, pmll_attention), n12 (carry_protocol).
# Each resumes the same RUN (the folder brought back and committed between the sessions).
# With one short session (about 1300 s left): n1s (part-a: the exactness grid at kd 128 only),
# n2, n3, then `nb RUN carry_step:300` (carry_step resumed; .sgl only).
# Usage (device machine, repo root): PMLL_LAB_COMMIT=<sha> bash scripts/gpu_session.sh PART [RUN]
#   or ... gpu_session.sh nb RUN NB[:SECONDS]... (those notebooks' full preset into RUN)
#   or ... gpu_session.sh fiver RUN [SECONDS [NB[:SECONDS]...]] (after parts a-c, with part-d:
#   FlashInfer's two releases, SECONDS each, then those notebooks' full preset into RUN)
#   or ... gpu_session.sh quick RUN [SECONDS [NB...]] (every notebook's, or those NBs', quick
#   preset on the GPU)
set -u
part=${1:?a session part: n1-n12, a, b, steps, last, ...}
run=${2:-h200-$(date -u +%Y-%m-%d)}
[ -f .fi/fi-unpack.sh ] && bash .fi/fi-unpack.sh
for w in .whl .whlm; do
  if ls $w/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/$w-done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $w/*.whl && touch /tmp/site/$w-done || exit 1
  fi
done
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD PYTHONUNBUFFERED=1
export JUPYTER_PATH=/tmp/site/share/jupyter PATH=/tmp/site/bin:$PATH
mkdir -p "$OUT/logs"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/logs/device.txt"
train() {   # the tokens notebook's GPU model (scripts/train_tiny_gdn.py)
  timeout 280 python3 scripts/train_tiny_gdn.py --size gpu --seed 0 --steps 1000 \
    --out "$OUT/tiny_gdn_gpu" --log-every 100 > "$OUT/logs/train_gpu.log" 2>&1
}
ab() {   # $1: packed_state_tile
  PMLL_LAB_PACKED_STATE_TILE=$1 timeout 100 python3 scripts/bench_step.py \
    --forms exact_lazy,plain_decode --states bfloat16 --batches 1,64,128 \
    --out "$OUT/logs/ab-step-p$1.jsonl" 2>&1 | tee "$OUT/logs/ab-step-p$1.log"
}
exactness() {   # $1 head sizes (comma-separated), $2 seconds, [$3 a job beside them,
                # $4 state dtypes, default the 2-byte pools]: the exactness grid with the shipped
                # switches, and SGLang's bitwise claim at kd 128, side by side
  for d in ${1//,/ }; do
    for l in kv vk; do
      timeout "$2" python3 -m pmll_lab.experiments.exactness --head-dims $d --layouts $l \
        --state-dtypes "${4:-bfloat16,float16}" --batch 32 --steps 8 \
        --out "$OUT/logs/exactness-kd$d-$l.jsonl" > "$OUT/logs/exactness-kd$d-$l.log" 2>&1 &
    done
  done
  timeout "$2" python3 -m pmll_lab.experiments.sglang_exactness --head-dims 128 \
    --out "$OUT/logs/sglang-exactness.jsonl" > "$OUT/logs/sglang-exactness.log" 2>&1 &
  ${3:-true} &                          # a third job beside them (the model's training)
  wait
  tail -n 1 "$OUT"/logs/exactness-*.log; tail -n 3 "$OUT/logs/sglang-exactness.log"
}
smoke() {   # every step form that needs no FlashInfer, B = 64, both pools: checked, then timed
  timeout 90 python3 scripts/bench_step.py --forms \
    exact_lazy,exact_eager,ring,ring_exact_fold,chain_restore,plain_decode,sglang_exact_fold,sglang_replayssm,sglang_replayssm_rawfold \
    --states bfloat16,float32 --batches 64 --out "$OUT/logs/smoke.jsonl" 2>&1 | tee "$OUT/logs/smoke.log"
}
notebooks() {   # the notebooks' full preset into one run folder kept across the calls; a run
                # committed in an earlier session (reports/RUN) is resumed from its copy
  if [ ! -d "/tmp/pmll-reports/$run" ] && [ -d "reports/$run" ]; then
    mkdir -p /tmp/pmll-reports && cp -r "reports/$run" /tmp/pmll-reports/
  fi
  REPORTS_DIR=/tmp/pmll-reports bash scripts/h200_reports.sh "$run" 150 "$@" 2>&1 \
    | tee -a "$OUT/logs/notebooks.log"
}
fi_releases() {   # FlashInfer's two releases (part-d beside parts a-c) on the ring and snapshot
                  # steps, one process per release, our ring in both ($1: seconds per release)
  [ -f .fi/fi-unpack-next.sh ] && bash .fi/fi-unpack-next.sh
  for site in /tmp/site /tmp/site-next; do
    tag=$(PYTHONPATH=$site:$PYTHONPATH python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null)
    echo "== FlashInfer $tag $(date -u +%H:%M:%S)"
    PYTHONPATH=$site:$PYTHONPATH timeout "${1:-150}" python3 scripts/bench_step.py \
      --forms ring,flashinfer_replayssm,flashinfer_snapshot_restore --states bfloat16 \
      --batches 1,8,64,128,256 --out "$OUT/logs/fi-$tag.jsonl" 2>&1 | tee "$OUT/logs/fi-$tag.log"
  done
}
case $part in
  n1) exactness 16,32,64,128,256 340 true float32,bfloat16,float16 ;;   # part-a: the whole grid
  n1s) exactness 128 "${3:-150}" true float32,bfloat16,float16 ;;   # part-a, a short session:
                                                 # kd 128, both layouts, every state dtype
  h1)         # one call, no FlashInfer (about 500 s): the exactness grid at kd 128 and SGLang's
              # claim, then the exact forms, the ring and SGLang's two designs, every B, both pools
    exactness 128 "${3:-130}" true float32,bfloat16,float16
    timeout "${4:-330}" python3 scripts/bench_step.py --forms \
      exact_lazy,exact_eager,exact_spec,plain_decode,sglang_exact_fold,ring,sglang_replayssm \
      --states bfloat16,float32 --batches 1,8,64,128,256 --out "$OUT/logs/h1.jsonl" 2>&1 \
      | tee "$OUT/logs/h1.log" ;;
  n2|n10) true ;;                                # part-b: FlashInfer's second part only
  n3) notebooks carry_step:540 ;;                # part-c.tar: FlashInfer unpacked
  n4) fi_releases 80; notebooks carry_step:300 ;;   # part-d.tar: the releases, carry_step resumed
  n5) notebooks pmll_ring:150 gdn_conv:150 ;;    # second session, part-a, .whl
  n6) smoke ;;                                   # part-b: every form, B = 64
  n7) notebooks roofline:540 ;;                  # part-c.tar
  n8) notebooks roofline:300 kernels:170 ;;      # roofline resumed, kernels
  n9) notebooks spec_decode:220 tokens:150 ;;    # third session, part-a, .whl, .whlm
  n11) notebooks gdn_verify:240 pmll_attention:200 ;;   # part-c.tar
  n12) notebooks carry_protocol:450 ;;
  nb) shift 2; notebooks "$@" ;;   # any notebooks: nb RUN NB[:SECONDS]...
  quick)      # every notebook's quick preset on the GPU (or those named), one run folder: the
              # workbench end to end on this card at this commit (quick RUN [SECONDS [NB...]])
    python3 -m ipykernel install --user --name python3 >/dev/null
    only=(); [ $# -gt 3 ] && only=(--only "${@:4}")
    timeout "${3:-480}" python3 -m pmll_lab report --preset quick --device cuda --run "$run" \
      --reports-dir /tmp/pmll-reports "${only[@]}" 2>&1 | tail -n 60 | tee "$OUT/logs/quick.log"
    tar czf "$OUT/$run.tgz" -C /tmp/pmll-reports "$run" ;;
  xnb)        # the whole exactness grid (every state dtype; EXACT_S seconds, the slowest process
              # took 316 s on an H100) and SGLang's claim, then notebooks
    shift 2; exactness 16,32,64,128,256 "${EXACT_S:-360}" true float32,bfloat16,float16
    notebooks "$@" ;;
  a)          # first of four calls (part-a): the bits, every form once, the packed-tile A/B
    exactness 64,128,256 180; smoke; ab 0; ab 1 ;;
  b)          # second (part-b, .whl): the carry_step notebook's quick preset on the GPU
    python3 -m ipykernel install --user --name python3 >/dev/null
    timeout 150 python3 -m pmll_lab report --preset quick --device cuda --run "$run-quick" \
      --only carry_step --reports-dir /tmp/pr 2>&1 | tail -n 30
    (cd /tmp/pr && tar czf "$OUT/quick.tgz" "$run-quick") ;;
  fill)       # one call, no FlashInfer: every other form at B = 1, 8 and 64, both pools
    timeout 400 python3 scripts/bench_step.py --forms \
      exact_lazy,exact_eager,ring,ring_exact_fold,chain_restore,plain_decode,sglang_exact_fold,sglang_replayssm,sglang_replayssm_rawfold \
      --states bfloat16,float32 --batches 1,8,64 --out "$OUT/logs/fill.jsonl" 2>&1 | tee "$OUT/logs/fill.log" ;;
  spec)       # the exact forms beside SGLang's fold-every-commit and the ring, every B, both
              # pools: the speculative store (exact_spec) against exact lazy and eager
    timeout "${3:-300}" python3 scripts/bench_step.py --forms \
      exact_lazy,exact_eager,exact_spec,plain_decode,sglang_exact_fold,ring \
      --states bfloat16,float32 --batches 1,8,64,128,256 --out "$OUT/logs/spec.jsonl" 2>&1 \
      | tee "$OUT/logs/spec.log" ;;
  fiver)      # carry .fi/part-d.tar after parts a-c: FlashInfer's two releases, then notebooks
    fi_releases "${3:-120}"; shift 3 2>/dev/null && [ $# -gt 0 ] && notebooks "$@" ;;
  probe)      # ring verify probes (scripts/probes/ring_*.py) beside the library kernel in one
              # process, lib first and last (the drift of the machine between them), both pools
    pv=(--ring-variant lib)
    for f in scripts/probes/ring_*.py; do [ -e "$f" ] && pv+=(--ring-variant "$f"); done
    timeout "${3:-240}" python3 scripts/bench_step.py --forms ring "${pv[@]}" --ring-variant lib \
      --states bfloat16,float32 --batches 1,8,64,128,256 --out "$OUT/logs/probe-ring.jsonl" 2>&1 \
      | tee "$OUT/logs/probe-ring.log" ;;
  ab0) ab 0 ;;
  ab1) ab 1 ;;
  first) exactness 64,128,256 200 ;;
  lite)       # the least: the 2-byte pools' bits at kd 128, SGLang's claim, the exact and ring
              # forms against SGLang's at B = 1, 64, 128 (about 5 minutes)
    exactness 128 120
    timeout 170 python3 scripts/bench_step.py --forms \
      exact_lazy,ring,chain_restore,sglang_exact_fold,sglang_replayssm \
      --states bfloat16,float32 --batches 1,64,128 --out "$OUT/logs/steps.jsonl" 2>&1 \
      | tee "$OUT/logs/steps.log" ;;
  one)        # a single call, no FlashInfer: bits first, then every form on a quiet GPU
    exactness 64,128,256 200
    timeout 260 python3 scripts/bench_step.py --forms \
      exact_lazy,exact_eager,ring,ring_exact_fold,chain_restore,sglang_exact_fold,sglang_replayssm,sglang_replayssm_rawfold \
      --states bfloat16,float32 --batches 1,8,64,128,256 --out "$OUT/logs/steps.jsonl" 2>&1 \
      | tee "$OUT/logs/steps.log"
    ab 0 ;;
  second) ab 0; ab 1 ;;
  steps)
    python3 -m ipykernel install --user --name python3 >/dev/null
    bash scripts/h200_reports.sh "$run" 400 carry_step:400 ;;
  last) fi_releases; exactness 16,32,256 200 train
    tail -n 5 "$OUT/logs/train_gpu.log" ;;
  *) echo "part: expected n1-n12, n1s, h1, probe, nb, xnb, quick, spec, fiver, a, b, fill, one, lite, first, second, steps, last, ab0 or ab1, got $part" >&2; exit 2 ;;
esac
# at most 8 files come back from $OUT: the logs travel as one archive
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
