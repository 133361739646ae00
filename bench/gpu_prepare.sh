#!/usr/bin/env bash
# Stage, on THIS machine, what bench/gpu_check.sh needs on the device machine (which reaches no package index and
# does not get ../shared): wheels for the Python packages its image lacks, and the GSM8K jsonl files.
#
#   bash bench/gpu_prepare.sh            # fills .whl/ (git-ignored: /.whl/ in .gitignore), ~10 MB
#   device run: command "bash bench/gpu_check.sh", carry [".whl"], timeout_s 600
#
# The device image (nvidia-h200, see /work/.library/device/KINDS.md) has python3 3.12 with torch 2.11+cu130,
# transformers 5.17, peft, accelerate, pyarrow, pandas, fsspec, filelock, pyyaml, pytest, pytest-timeout, xxhash.
# It lacks omegaconf (our config loader; 2.4 needs only PyYAML) and, for the TRL peer of bench_ppo_step.py,
# trl + datasets (+ dill, multiprocess). Ray is not needed there: the GPU tests and the bench use LocalWorkerGroup.
# vLLM cannot travel (its wheel is far over the 64 MiB a call may carry), so the vLLM checks skip there.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$REPO/.whl"
GSM8K="${GSM8K_DIR:-$REPO/../shared/data/gsm8k}"
PIP=("${PYTHON:-$REPO/.venv/bin/python}" -m pip --disable-pip-version-check)
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

mkdir -p "$DEST"
# required: without omegaconf nothing of ours imports there
"${PIP[@]}" download -q --no-deps "${PLATFORM[@]}" -d "$DEST" "omegaconf==2.4.0"
# optional: the TRL peer (skipped there with a clear line when these are missing)
for req in "trl==1.16.0" "datasets" "dill" "multiprocess"; do
  "${PIP[@]}" download -q --no-deps "${PLATFORM[@]}" -d "$DEST" "$req" || echo "optional wheel $req not staged"
done
rm -rf "$DEST/gsm8k" && mkdir -p "$DEST/gsm8k"
cp "$GSM8K/train.jsonl" "$GSM8K/test.jsonl" "$DEST/gsm8k/"
ls -la "$DEST"
du -sh "$DEST"
