# Event OS. `make` prints the targets; CI calls only these targets.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PYTHON := $(PYTHON)

.DEFAULT_GOAL := help

help: ## print the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv==$(UV_VERSION)

$(VENV)/.installed: $(UV) uv.lock pyproject.toml libs/eventos/pyproject.toml $(wildcard services/*/pyproject.toml)
	$(UV) sync --frozen --all-packages
	@touch $@

install: $(VENV)/.installed ## install everything into .venv from the lock file

lock: $(UV) ## re-resolve uv.lock after a dependency change
	$(UV) lock

proto: install ## regenerate the gRPC/protobuf code from proto/eventos/v1
	$(PY) scripts/protogen.py

migrate: install ## apply the database migrations (EVENTOS_DATABASE_URL or the local instance)
	$(VENV)/bin/eventosctl migrate

run: install ## start a local instance: PostgreSQL, Temporal dev server, all services
	$(PY) -m eventos.localstack

lint: install ## ruff (format + lint) and mypy
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy libs/eventos/src services/*/src

test: lint ## lint, then every test (unit, integration, e2e) on real PostgreSQL and Temporal
	$(VENV)/bin/pytest -q

bench: install ## run the load drivers in bench/ and print their figures
	$(PY) bench/ingress.py
	$(PY) bench/publish.py
	$(PY) bench/chat_latency.py
	$(PY) bench/burst.py
	$(PY) bench/relay.py

clean: ## remove the local instance state and the virtualenvs
	rm -rf .eventos $(VENV) $(TOOLS)

.PHONY: help install lock proto migrate run lint test bench clean
