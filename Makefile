# make run: serve the hooks locally (no cluster needed). make test: lint, types, the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test unit lint tools lock settings-table fuzz bench bench-load bench-admission mutate clean \
	image image-base image-test bugs e2e bench-metacontroller bench-report release

# Exact versions with hashes from the lock, then the project itself (its dependencies are all in
# the lock; setuptools, pinned there too, builds it without a download).
$(BIN)/gpuclass-hooks: pyproject.toml requirements-test.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements-test.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# Refresh both locks after changing dependencies in pyproject.toml (needs the package index).
LOCK := $(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-find-links --no-emit-index-url pyproject.toml
lock: $(BIN)/gpuclass-hooks
	$(BIN)/pip install --quiet pip-tools
	$(LOCK) --output-file requirements.lock
	$(LOCK) --extra test --output-file requirements-test.lock
	$(LOCK) --only-build-deps --all-build-deps --output-file requirements-build.lock

# The README's settings table is made from hooks/settings.py; a test fails until it is current.
settings-table: $(BIN)/gpuclass-hooks
	$(BIN)/python -m hooks.settings

run: $(BIN)/gpuclass-hooks
	$(BIN)/gpuclass-hooks serve --bind 127.0.0.1:8080

# helm, etcd and kube-apiserver, which the tests run, are built from the Go module proxy once per
# version and cached outside the repository (first run about 10 minutes on 2 cores; then nothing).
TESTENV := $(or $(GPUCLASS_TESTENV_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gpuclass-hooks/testenv)
export GPUCLASS_TESTENV_CACHE := $(TESTENV)

tools:
	bash testenv/build.sh

lint: $(BIN)/gpuclass-hooks
	$(BIN)/ruff check hooks tests bench fuzz mutation testenv release
	$(BIN)/ruff format --check hooks tests bench fuzz mutation testenv release
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

test: lint tools
	PATH=$(TESTENV):$(abspath $(BIN)):$$PATH $(BIN)/pytest

# The quick tier: everything but the tests that need the Go-built tools or start gunicorn (no Go
# needed), property tests on fewer examples. `make test` still runs all of them at full count,
# and CI refuses skips.
unit: $(BIN)/gpuclass-hooks
	$(BIN)/pytest -q -m "not tools and not live" --hypothesis-profile=quick

# Speed and memory on generated clusters. SIZES=S,M,L for the full run (a few minutes, ~6 GB).
SIZES ?= S,M
bench: $(BIN)/gpuclass-hooks
	$(BIN)/python -m bench.run --sizes $(SIZES)

# Raw heads and bodies against every port (FUZZ_HEADS inputs each: the admission, health and
# metrics listeners in process, the hook port through gunicorn; the unit and live tiers send a few
# hundred), then coverage-guided fuzzing of the hook and admission routes (atheris);
# not in CI. FUZZ_SECONDS bounds the second.
FUZZ_SECONDS ?= 300
FUZZ_HEADS ?= 100000
fuzz: $(BIN)/gpuclass-hooks
	GPUCLASS_FUZZ_HEADS=$(FUZZ_HEADS) $(BIN)/pytest -q -p no:cacheprovider tests/serving/test_head_fuzz.py \
		tests/serving/live/test_hook_port_fuzz.py
	$(BIN)/pip install --quiet atheris
	$(BIN)/python fuzz/fuzz_hooks.py seed .fuzz-corpus examples
	$(BIN)/python fuzz/fuzz_hooks.py -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 .fuzz-corpus

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Ten concurrent L-sized status syncs with and without the memory budget (a few minutes, several
# GB); ARGS=--slow-clients: 32 stalled clients beside ten M-sized syncs; ARGS=--hostile-clients:
# trickling heads, stalled handshakes, an idle flood and 1 GB admission declarations, none with
# the token, beside authenticated calls (about a minute); ARGS=--slow-api: reviews and status
# syncs against an API server that delays, trickles and recovers; ARGS=--keep-alive-callers: 300
# callers on kept-alive connections; ARGS=--slow-heads: 1,000 never-ending heads on the admission
# port beside kept-alive reviews (a minute or two each).
ARGS ?=
# The budget report's sync at 1,000 tenants x $(APPS) apps: size, time, the served peak memory.
APPS ?= 50
bench-report: $(BIN)/gpuclass-hooks
	$(BIN)/python -m bench.report --apps $(APPS)

bench-load: $(BIN)/gpuclass-hooks
	$(BIN)/python -m bench.load $(ARGS)

# Budget reviews against a real kube-apiserver holding 200x50 and 1000x50 tenants x apps: the
# service's scoped reads and the fresh-LIST baseline (about 15 minutes; needs make tools).
bench-admission: $(BIN)/gpuclass-hooks tools
	PATH=$(TESTENV):$$PATH $(BIN)/python -m bench.admission

# Metacontroller's memory with the chart's controllers on generated clusters (docs/cozystack.md):
# its informers hold every Node, Pod, Namespace and Secret. Needs `bash testenv/build.sh cluster`.
# ARGS='--go-env GOMEMLIMIT=2GiB' adds a run with that Go environment; ARGS='--churn-seconds 120'
# follows each with a quiet minute and a steady churn (docs/scale.md); ARGS='... --restart' then
# starts Metacontroller again over what it wrote, under churn from its first second.
bench-metacontroller: $(BIN)/gpuclass-hooks tools
	PATH=$(TESTENV):$$PATH $(BIN)/python -m bench.metacontroller --sizes $(SIZES) $(ARGS)

# Each patch under mutation/bugs/ puts back a bug; make unit must fail on every one (a few
# minutes; not in CI). NAMES='a b' checks only those patches.
NAMES ?=
bugs: $(BIN)/gpuclass-hooks
	$(BIN)/python mutation/bugs.py $(NAMES)

# Mutation testing of the whole service but its entry point (mutmut; not in CI): a full run takes
# hours (docs/mutation.md); MUTANTS='hooks.rules.budget*' runs one module. The report counts
# the survivors listed in mutation/equivalent.txt as equivalent, those no test reaches as
# survivors, and prints only the news.
MUTANTS ?=
mutate: $(BIN)/gpuclass-hooks tools
	$(BIN)/pip install --quiet 'mutmut>=3.8,<4'
	PATH=$(TESTENV):$$PATH $(BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(BIN)/mutmut results --all true | $(BIN)/python mutation/report.py

# The image, built with no network from a wheelhouse the host's pip fills from the hashed locks
# (docs/install.md). PYTHON_IMAGE is its base: python:3.11-slim from a registry, or where no
# registry is reachable the Debian base `make image-base` builds with mmdebstrap.
IMAGE ?= gpuclass-hooks:dev
PYTHON_IMAGE ?= python:3.11-slim
BASE_IMAGE := gpuclass-hooks-base:$(shell . /etc/os-release 2>/dev/null && echo $$VERSION_CODENAME)
image-base:
	bash image/base.sh $(BASE_IMAGE)
	@echo "now: make image PYTHON_IMAGE=$(BASE_IMAGE)"

image: $(BIN)/gpuclass-hooks
	PIP=$(abspath $(BIN))/pip bash image/build.sh $(PYTHON_IMAGE) $(IMAGE)

# Builds the image and runs it as the chart does, against the service run from the venv.
image-test: image tools
	PATH=$(TESTENV):$(abspath $(BIN)):$$PATH $(BIN)/pytest tests/image \
		--image $(IMAGE) --image-base $(PYTHON_IMAGE)

# A release from a clean tree (docs/development.md, "Releases"): sets VERSION, commits and tags it,
# and writes the chart package, the image as an OCI archive and both SBOMs to dist/$(VERSION)/;
# prints the image's digest. Nothing is pushed.
VERSION ?=
release: $(BIN)/gpuclass-hooks tools
	@test -n "$(VERSION)" || { echo "make release VERSION=x.y.z" >&2; exit 2; }
	PATH=$(TESTENV):$(abspath $(BIN)):$$PATH $(BIN)/python release/release.py \
		--version $(VERSION) --base $(PYTHON_IMAGE)

# The install as a cluster runs it: a two-node cluster (kubelets, containerd, CoreDNS; the second
# node's GPUs advertised by a fake device plugin) booted in a network namespace of its own with no
# route out, Metacontroller and cert-manager in it, and docs/install.md followed step by step
# (docs/cluster.md: what it needs and leaves).
# Needs root and Debian's containerd, runc, containernetworking-plugins and iptables.
# The upgrade scenario starts from the previous release (the newest `release x.y.z` commit in
# HEAD's history), whose image is built here first, outside the cluster's namespace.
E2E_DIR ?= $(or $(TMPDIR),/tmp)/gpuclass-hooks-e2e
E2E_PREVIOUS ?= $(E2E_DIR)-previous
e2e: image
	bash testenv/build.sh cluster >/dev/null
	PIP=$(abspath $(BIN))/pip $(BIN)/python -m release.previous --base $(PYTHON_IMAGE) \
		--into $(E2E_PREVIOUS)
	PATH=$(TESTENV):$(abspath $(BIN)):$$PATH $(BIN)/python testenv/cluster.py run \
		--dir $(E2E_DIR) --tools $(TESTENV) -- \
		$(abspath $(BIN))/pytest tests/e2e -p no:cacheprovider --e2e-image $(IMAGE) \
		--e2e-previous $(E2E_PREVIOUS)
