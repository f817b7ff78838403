# Two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv, install parplan with everything it needs, then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.parplan-installed

# torchvision needs the torch it was built against; these pairs install on
# the machines we use (x86_64: CUDA build that also runs on CPU; aarch64: CPU build).
ARCH := $(shell uname -m)
ifeq ($(ARCH),aarch64)
TORCH_PINS := torch==2.9.1 torchvision==0.24.1
else
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
endif

# the suite in two processes (pytest-xdist), each test file whole on one (its module-scoped rank pools shared)
TEST_WORKERS ?= 2

DEMO_MODEL   ?= torchvision:resnet50
DEMO_SHAPE   ?= 64,3,2048,2048
DEMO_DEVICES ?= 1024

.PHONY: setup demo lint test clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PINS)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: setup
	$(BIN)/parplan plan --model $(DEMO_MODEL) --input-shape $(DEMO_SHAPE) --profile h100 \
		--devices $(DEMO_DEVICES) --devices-per-node 8 --out demo-plan.json --plot demo-plan.png

# ruff and mypy over the library packages (pyproject.toml), before the tests.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

test: setup lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
