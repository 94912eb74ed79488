#!/usr/bin/env bash
# Every GPU figure the open issues ask for, in one run of about 8 minutes on one CUDA GPU:
#   1. GRPO step, ours vs TRL's GRPOTrainer, paired rounds, Qwen2.5-0.5B-shaped model (grpo_vs_trl.py --preset gpu)
#   2. the same on the real SmolLM2-135M-Instruct (grpo_vs_trl.py --preset smollm2 --device cuda)
#   3. text-to-image GRPO with SD-1.5's shapes: s/step and peak memory (grpo_text_to_image.py --preset gpu)
#   4. fused SDPA vs chunked linear attention against sequence length (attention_gpu.py)
# Each step has its own time limit, so one failure or overrun does not stop the rest; all output goes to one
# results file, $OUT/gpu_suite.txt ($OUT if set, else runs/gpu_suite/), and the GRPO figures also to JSON files.
#
#   bash benchmarks/gpu_suite.sh                 # on the GPU machine
#   bash benchmarks/gpu_suite.sh --dry-run       # (or DRY_RUN=1) tiny sizes on the CPU, ~2 min: checks the wiring
#
# SmolLM2: SMOLLM2_DIR=<hub-format folder>; without it the suite tries `minigrpo models fetch smollm2`, and skips
# the step with one line if that gives no folder. PYTHON: the interpreter (default .venv/bin/python, else python).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY_RUN=${DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT=${OUT:-runs/gpu_suite}
mkdir -p "$OUT"
RESULTS="$OUT/gpu_suite.txt"
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1

log() { echo "$*" | tee -a "$RESULTS"; }

# run NAME SECONDS CMD...: one step under its own time limit, its output appended to the results file
run() {
  local name=$1 limit=$2; shift 2
  log ""
  log "=== $name  (limit ${limit}s; $(date -u +%FT%TZ); load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null))"
  log "\$ $*"
  local start=$SECONDS
  timeout --kill-after=20 "$limit" "$@" 2>&1 | grep -v -e "Loading weights" -e "Writing model shards" | tee -a "$RESULTS"
  local rc=${PIPESTATUS[0]}
  local what="ok"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && what="TIMED OUT"
  [ "$rc" -ne 0 ] && [ "$what" = ok ] && what="FAILED"
  log "=== $name: $what (exit $rc, $((SECONDS - start)) s)"
}

: > "$RESULTS"
log "gpu_suite: $(date -u +%FT%TZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), dry run: $DRY_RUN"
"$PY" -c "import torch, transformers, trl; print('torch', torch.__version__, '| transformers', transformers.__version__, '| trl', trl.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')" 2>&1 | tee -a "$RESULTS"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$RESULTS"

SMOLLM2=${SMOLLM2_DIR:-}
if [ -z "$SMOLLM2" ]; then
  SMOLLM2=$("$PY" -m minigrpo models fetch smollm2 2>/dev/null | tail -1)
  [ -f "$SMOLLM2/config.json" ] || SMOLLM2=""
fi

if [ "$DRY_RUN" = 1 ]; then
  run "grpo_vs_trl tiny (dry run of --preset gpu)" 150 \
    "$PY" benchmarks/grpo_vs_trl.py --preset tiny --rounds 2 --warmup 1 --json "$OUT/grpo_vs_trl_gpu.json"
  if [ -n "$SMOLLM2" ]; then
    run "grpo_vs_trl smollm2 (dry run: CPU, 8 tokens)" 150 \
      "$PY" benchmarks/grpo_vs_trl.py --preset smollm2 --model-dir "$SMOLLM2" --device cpu --tokens 8 --rounds 1 \
      --warmup 1 --json "$OUT/grpo_vs_trl_smollm2.json"
  else
    log "=== grpo_vs_trl smollm2: skipped (no model folder: set SMOLLM2_DIR)"
  fi
  run "grpo_text_to_image tiny (dry run of --preset gpu)" 150 "$PY" benchmarks/grpo_text_to_image.py --preset tiny --steps 1
  run "attention_gpu (dry run: short lengths)" 60 "$PY" benchmarks/attention_gpu.py --lengths 512 1024 --repeats 2
else
  run "grpo_vs_trl --preset gpu (paired rounds)" 210 \
    "$PY" benchmarks/grpo_vs_trl.py --preset gpu --rounds 4 --warmup 1 --json "$OUT/grpo_vs_trl_gpu.json"
  if [ -n "$SMOLLM2" ]; then
    run "grpo_vs_trl --preset smollm2 on cuda (paired rounds)" 90 \
      "$PY" benchmarks/grpo_vs_trl.py --preset smollm2 --model-dir "$SMOLLM2" --device cuda --rounds 6 --warmup 1 \
      --json "$OUT/grpo_vs_trl_smollm2.json"
  else
    log "=== grpo_vs_trl smollm2: skipped (no model folder: set SMOLLM2_DIR)"
  fi
  run "grpo_text_to_image --preset gpu (SD-1.5 shapes)" 150 "$PY" benchmarks/grpo_text_to_image.py --preset gpu --steps 2
  run "attention_gpu" 90 "$PY" benchmarks/attention_gpu.py --repeats 5
fi
log ""
log "gpu_suite: done $(date -u +%FT%TZ); results in $RESULTS"
