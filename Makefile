# The two set-up commands are `make run` and `make test`; everything else is a helper.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test test-fast check format migrate demo clean

$(STAMP): pyproject.toml training/poc/_simd.c $(wildcard training/poc/simd/*)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[platform,dev]'
	@touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py demo
	PORT=$(PORT) $(BIN)/python manage.py demo_provider

# The whole platform on this machine: ASGI server, platform and control workers, beat and a
# local provider agent (Procfile).
run: demo
	@echo "Proofwork on http://$(HOST):$(PORT)/  (Ctrl-C stops every process)"
	HOST=$(HOST) WEB_PORT=$(PORT) PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start -f Procfile

# Lint, types, import contracts and migrations first, then the whole suite in two runs: the
# tests that need no real processes of their own, one process per core (pytest-xdist; each
# with its own var/test/<worker> and Redis databases, config/test_settings.py), then the
# browser (e2e) and slow tests in two processes: they start servers, agents and training
# runs, and spend much of their time waiting on them, so two overlap well even on two
# cores, and more would compete for them. Both always run; either failing (exit 5,
# nothing collected, included) fails the target.
test: check
	@status=0; \
	$(BIN)/python -m pytest -m "not e2e and not slow" -n auto || status=$$?; \
	$(BIN)/python -m pytest -m "e2e or slow" -n 2 || status=$$?; \
	exit $$status

# The quick loop while working: the suite without the browser (e2e) and slow tests, one
# process per core (pytest-xdist; each gets its own var/test/<worker>, config/test_settings.py).
# No `check` first: run `make check` before a commit.
test-fast: install
	$(BIN)/python -m pytest -m "not e2e and not slow" -n auto

check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
