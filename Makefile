# Routewatch. `make run` brings the whole product up with demo data; `make test` runs every check.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Installs are reproducible: exact versions with hashes from requirements.lock (`make lock`
# regenerates it, and requirements-runtime.lock for the Docker image, from pyproject.toml).
LOCK := requirements.lock
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) | cksum | cut -d' ' -f1)
UV := $(VENV)/bin/uv
LOCK_ARGS := --python-version 3.11 --python-platform linux --generate-hashes --custom-compile-command "make lock"
# mypy's Django plugin imports the settings; it needs values, not servers.
TYPECHECK_ENV := SECRET_KEY=typecheck-typecheck-typecheck-typecheck-typecheck-typecheck FIELD_ENCRYPTION_KEYS=YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE= \
	DATABASE_URL=postgresql://typecheck@localhost/typecheck REDIS_URL=redis://localhost:6379/0

.PHONY: install lock run test lint typecheck pytest test-faults bench bench-simulator bench-probes bench-scenarios bench-scale bench-pages bench-partitions bench-load bench-region vendor clean

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	@# A lock older than pyproject.toml's dependencies shows here: run `make lock`.
	$(PY) -m pip check
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

# Resolve pyproject.toml again for Python 3.11 on Linux, keeping the pins it still allows
# (`make lock UPGRADE=1`: the newest versions its ranges allow).
lock:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(PY) -m pip install --quiet 'uv>=0.13,<0.14'
	$(UV) pip compile pyproject.toml --extra embedded --extra dev $(LOCK_ARGS) $(if $(UPGRADE),--upgrade) -o $(LOCK)
	$(UV) pip compile pyproject.toml -c $(LOCK) $(LOCK_ARGS) -o requirements-runtime.lock

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

# The fault suite alone (issue 28): RUNS=5 runs it five times in a row, stopping at the first
# failure; run it while `make bench-load` loads the machine to check it holds under load.
RUNS ?= 1
test-faults: $(STAMP)
	@for i in $$(seq $(RUNS)); do echo "fault suite, run $$i of $(RUNS)"; \
	  $(PY) -m devstack test -- -m fault -p no:cacheprovider $(PYTEST_ARGS) || exit 1; done

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

# The partitioning migration on a populated table (time, write stalls) and retention's cost.
bench-partitions: $(STAMP)
	$(PY) -m devstack exec -- $(PY) bench/bench_partitions.py $(ARGS)

# The whole pipeline at load against the simulator, realistic route mix (ARGS="--mix fast", "--scale 3").
bench-load: $(STAMP)
	$(PY) -m devstack exec -- $(PY) bench/bench_load.py $(ARGS)

# One region worker process at rising numbers of slow probes in flight: its knee (start lag).
bench-region: $(STAMP)
	$(PY) -m devstack exec -- $(PY) bench/bench_region.py $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
