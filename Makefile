# Tranche: every command a developer or CI needs. `make test` works on a fresh clone.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_SRC := $(shell find proto -name '*.proto' 2>/dev/null)
# Real nodes need root (and apt for their packages): only root builds their binaries up front.
NODE_BINS := $(if $(filter 0,$(shell id -u)),node-bins,)

.PHONY: all venv bytecode generate check-generated lint typecheck contracts check test test-matrix unit e2e bench demo k8s-bins node-bins helm-bin prometheus-bin rules-test image clean

all: check

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# The project's modules as bytecode (hack/bytecode.py): the processes the tests, the demo and
# the benchmarks start load them instead of compiling them at every start, as the image does.
bytecode: $(STAMP)
	@$(BIN)/python -m hack.bytecode

# The version matrix (docs/development.md#version-matrix). K8S picks the control plane of
# `make e2e`/`make test` (default 1.37); `make test-matrix` runs the `matrix`-marked core
# subset on every older version; `make test` (CI) also runs it on CI_MATRIX and prints the
# versions it leaves to `make test-matrix`.
K8S ?= $(or $(TRANCHE_K8S_VERSION),1.37)
MATRIX ?= 1.34 1.35 1.36
CI_MATRIX ?= 1.34
export TRANCHE_K8S_VERSION := $(K8S)

k8s-bins:
	hack/build-k8s.sh --version $(K8S) >/dev/null

node-bins:
	hack/build-node.sh --version $(K8S) >/dev/null

helm-bin:
	hack/build-helm.sh >/dev/null

# prometheus and promtool 3.16.0, built from the pinned Go module (cached; progress on stderr).
prometheus-bin:
	hack/build-prometheus.sh >/dev/null

PROM_RULES := deploy/prometheus/tranche-rules.yaml
CHART_RULES := deploy/helm/tranche/files/prometheus/tranche-rules.yaml

# The recording rules and alerts: promtool's checks and unit tests, and the chart's copy.
rules-test: prometheus-bin
	@bin=$$(hack/build-prometheus.sh 2>/dev/null) && \
	  "$$bin/promtool" check rules --lint=all $(PROM_RULES) && \
	  "$$bin/promtool" test rules deploy/prometheus/tests/*.yaml
	@cmp -s $(PROM_RULES) $(CHART_RULES) || { \
	  echo "$(CHART_RULES) differs from $(PROM_RULES): cp $(PROM_RULES) $(CHART_RULES)" >&2; exit 1; }

# The image from deploy/Containerfile with buildah (installed when missing), no Docker, no
# registry: localhost/tranche:<version> and dist/tranche-image.tar (the last line printed),
# cached outside the repository by its inputs (hack/build-image.sh).
image:
	hack/build-image.sh

generate: $(STAMP)
	$(BIN)/python hack/generate_proto.py

check-generated: $(STAMP)
	$(BIN)/python hack/generate_proto.py --check

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck contracts check-generated

unit: $(STAMP) bytecode
	$(BIN)/pytest tests/unit

e2e: $(STAMP) bytecode k8s-bins $(NODE_BINS) helm-bin prometheus-bin
	$(BIN)/pytest tests/e2e

# --durations: the slowest tests in CI's log, the evidence for one that nears its timeout.
test: $(STAMP) bytecode k8s-bins $(NODE_BINS) helm-bin prometheus-bin check rules-test
	$(BIN)/pytest --durations=25
	@if [ "$(K8S)" = 1.37 ] && [ -n "$(CI_MATRIX)" ]; then $(MAKE) --no-print-directory test-matrix MATRIX="$(CI_MATRIX)"; fi
	@skipped="$(filter-out $(CI_MATRIX),$(MATRIX))"; if [ "$(K8S)" = 1.37 ] && [ -n "$$skipped" ]; then \
	  echo "make test: the version matrix ran on $(or $(CI_MATRIX),no older version) only; not on $$skipped:"; \
	  echo "  each older control plane is a cold build of about 7-20 minutes on 2 cores, and all of"; \
	  echo "  them would take make test past its 90-minute budget; run 'make test-matrix' for them"; fi

# The core e2e subset on each version of MATRIX, real nodes included (builds each control plane
# and, as root, each kubelet; cached).
test-matrix: $(STAMP) helm-bin
	@set -e; for v in $(MATRIX); do \
	  echo "== test-matrix: Kubernetes $$v"; start=$$(date +%s); \
	  hack/build-k8s.sh --version $$v >/dev/null; \
	  if [ -n "$(NODE_BINS)" ]; then hack/build-node.sh --version $$v >/dev/null; fi; \
	  TRANCHE_K8S_VERSION=$$v $(BIN)/pytest -m matrix tests/e2e; \
	  echo "== test-matrix: Kubernetes $$v passed in $$(( $$(date +%s) - start ))s"; \
	done

bench: $(STAMP) bytecode k8s-bins
	$(BIN)/python -m hack.bench $(BENCH_ARGS)

demo: $(STAMP) bytecode k8s-bins
	$(BIN)/python -m hack.demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Headless Chromium for the showback page's test (tests/e2e/test_report_html.py): Debian's
# package, installed when missing (CI runs as root on a fresh machine). `make e2e` and
# `make test` depend on it.
.PHONY: chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

e2e test: chromium
