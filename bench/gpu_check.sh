#!/usr/bin/env bash
# The ONE prepared check for a lent GPU machine (one H200): environment, GPU tests, GPU throughput bench.
#
#   here:    bash bench/gpu_prepare.sh                       # stage wheels + GSM8K into .whl/ (git-ignored)
#   device:  run  command="bash bench/gpu_check.sh"  carry=[".whl"]  timeout_s=600
#
# Every step runs under `timeout`, and the whole script under a budget (GPU_CHECK_BUDGET_S, default 500 s) so
# it ends well inside one 10-minute call; a step that would start with < 20 s left is skipped and says so.
# Results land in $OUT (at most 8 files, flat):
#   summary.txt       one line per step: start, end, exit code, TIMEOUT/SKIP
#   env.txt           the machine's limits (bench_limits.py --device cuda: bf16/fp32 GEMM peak, HBM bandwidth by a
#                     STREAM copy/triad, per stage the fraction reached at 1 M / 20 M / 100 M parameters, also in
#                     summary.txt; in env.txt, not a file of its own: at most 8 files come back), nvidia-smi, python/torch/transformers versions, what was installed and how
#   pytest_gpu.log    pytest -m gpu tests/gpu (FSDP2 on CUDA with offload, RM on CUDA, vLLM when importable)
#   bench_tiny.log / bench_tiny.json      bench_ppo_step.py --device cuda, the CPU bench's workload
#   bench_large.log / bench_large.json    the same step on a ~90 M-parameter Qwen2, 32 prompts x 4 x 128 tokens
#   bench_vllm.log    our step (in-process and through Ray) with the vLLM rollout, bf16, packed, 20 M model, vs TRL
#                     (only when vllm imports there; else a SKIP line in summary)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:-$REPO/.gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET_S:-500}"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
ENVF="$OUT/env.txt"

log() { echo "[$(date +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME LIMIT_S LOGFILE CMD... : run CMD under timeout (capped by what is left of the budget), log the outcome
step() {
  local name=$1 limit=$2 logf=$3; shift 3
  local l; l=$(left)
  if (( l < 20 )); then log "SKIP $name: budget spent"; return 0; fi
  (( limit > l )) && limit=$l
  log "START $name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" >>"$logf" 2>&1
  local rc=$?
  if (( rc == 124 || rc == 137 )); then log "END $name rc=$rc TIMEOUT"; else log "END $name rc=$rc"; fi
  return 0
}

# ---- environment ----------------------------------------------------------------------------------------------
{
  echo "== nvidia-smi"; timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi failed"
  echo "== python: $(command -v "$PY") $("$PY" --version 2>&1); nproc $(nproc); $(free -g | sed -n 2p)"
} >>"$ENVF" 2>&1

# missing packages: carried wheels first (no index there), then the index if it answers (it usually does not);
# never a torch, never with deps (the image's torch + CUDA stack stays as it is)
SITE="${GPU_CHECK_SITE:-/tmp/site}"
mkdir -p "$SITE"
if ls .whl/*.whl >/dev/null 2>&1; then
  timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .whl/*.whl >>"$ENVF" 2>&1 && echo "== installed carried wheels into $SITE: $(ls .whl/*.whl | xargs -n1 basename | tr '\n' ' ')" >>"$ENVF"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import omegaconf" 2>/dev/null; then
  echo "== omegaconf missing after the wheels: trying the package index (20 s)" >>"$ENVF"
  timeout 60 "$PY" -m pip install -q --no-deps --target "$SITE" "omegaconf==2.4.0" "PyYAML" >>"$ENVF" 2>&1 \
    || echo "   index unreachable: the tests will fail at import (run bench/gpu_prepare.sh here and carry .whl)" >>"$ENVF"
fi
"$PY" - >>"$ENVF" 2>&1 <<'EOF'
import importlib, importlib.metadata as md
for name in ("torch", "transformers", "tokenizers", "peft", "accelerate", "omegaconf", "pyarrow", "pytest",
             "pytest-timeout", "trl", "datasets", "vllm", "ray"):
    try:
        print(f"{name:16s} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:16s} -- not installed")
import torch
print("cuda available:", torch.cuda.is_available(), "| device:", torch.cuda.get_device_name() if torch.cuda.is_available() else None,
      "| torch cuda:", torch.version.cuda, "| nccl:", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
EOF

if [ -z "${GSM8K_DIR:-}" ]; then
  for d in "$REPO/../shared/data/gsm8k" "$REPO/shared/data/gsm8k" "$REPO/.whl/gsm8k"; do
    [ -f "$d/train.jsonl" ] && export GSM8K_DIR="$(cd "$d" && pwd)" && break
  done
fi
echo "== GSM8K_DIR=${GSM8K_DIR:-NOT FOUND (tests and bench will fail: run bench/gpu_prepare.sh, carry .whl)}" >>"$ENVF"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}" TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
log "environment ready (see env.txt)"

# ---- GPU tests --------------------------------------------------------------------------------------------------
step "pytest -m gpu tests/gpu" 200 "$OUT/pytest_gpu.log" \
  "$PY" -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider -o addopts="" --timeout 180
tail -n 3 "$OUT/pytest_gpu.log" | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- the machine's limits and each stage's fraction of them (issue 38) ----------------------------------------
step "limits (cuda: GEMM peak, HBM bandwidth, stage fractions)" 90 "$ENVF" \
  "$PY" bench/bench_limits.py --device cuda --sizes 1m,20m,100m --reps 3 --batch 32 --new-tokens 128 --stream-mb 1024
grep -E "^limits|^[0-9]+m |  (decode|log_prob|update)" "$ENVF" | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- GPU throughput -----------------------------------------------------------------------------------------------
step "bench tiny (cuda, bf16, packed)" 110 "$OUT/bench_tiny.log" \
  "$PY" bench/bench_ppo_step.py --device cuda --peers ours,trl,hf --bf16 --remove-padding --steps 5 --peer-timeout 60 \
  --json "$OUT/bench_tiny.json"
step "bench large (cuda)" 170 "$OUT/bench_large.log" \
  "$PY" bench/bench_ppo_step.py --device cuda --peers ours,trl,hf --bf16 --remove-padding --steps 4 --peer-timeout 75 \
  --prompts 32 --new-tokens 128 --hidden-size 1024 --intermediate-size 2816 --num-layers 8 \
  --num-attention-heads 16 --num-key-value-heads 4 --json "$OUT/bench_large.json"
if "$PY" -c "import vllm" >/dev/null 2>&1; then
  # the GPU configuration of issue 14: bf16 compute, packed forwards (flash/sdpa varlen), vLLM rollout
  step "bench 20m, bf16 + packed + vLLM rollout (cuda)" 120 "$OUT/bench_vllm.log" \
    "$PY" bench/bench_ppo_step.py --device cuda --peers ours,ours_ray,trl --rollout vllm --bf16 --remove-padding \
    --size 20m --steps 5 --peer-timeout 100
else
  log "SKIP vLLM rollout bench: vllm is not importable here (it cannot be carried: wheel > 64 MiB)"
fi
for f in bench_tiny bench_large bench_vllm; do
  [ -f "$OUT/$f.log" ] && { echo "---- $f"; grep -E "s/step|SKIPPED|FAILED|ratio|GRPO step" "$OUT/$f.log" \
    || tail -n 3 "$OUT/$f.log"; } | tee -a "$SUMMARY"
done
log "done in $(( $(date +%s) - START )) s"
