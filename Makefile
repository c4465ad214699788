# make run: serve the hooks locally (no cluster needed). make test: lint, types, the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HELM_VERSION := v3.22.0

.PHONY: run test lint tools fuzz bench clean

$(BIN)/gpuclass-hooks: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(BIN)/gpuclass-hooks
	$(BIN)/gpuclass-hooks serve --bind 127.0.0.1:8080

# helm renders the chart in the tests; it is built from source with Go into the virtualenv.
$(BIN)/helm: | $(BIN)/gpuclass-hooks
	GOBIN=$(abspath $(BIN)) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

tools: $(BIN)/helm

lint: $(BIN)/gpuclass-hooks
	$(BIN)/ruff check hooks tests bench fuzz
	$(BIN)/ruff format --check hooks tests bench fuzz
	$(BIN)/mypy

test: lint tools
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/pytest

# Speed and memory on generated clusters. SIZES=S,M,L for the full run (a few minutes, ~6 GB).
SIZES ?= S,M
bench: $(BIN)/gpuclass-hooks
	$(BIN)/python -m bench.run --sizes $(SIZES)

# Coverage-guided fuzzing of the hook routes (atheris); not in CI. FUZZ_SECONDS bounds a run.
FUZZ_SECONDS ?= 300
fuzz: $(BIN)/gpuclass-hooks
	$(BIN)/pip install --quiet atheris
	mkdir -p .fuzz-corpus && cp examples/*.json .fuzz-corpus/
	$(BIN)/python fuzz/fuzz_hooks.py -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 .fuzz-corpus

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
