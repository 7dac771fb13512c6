# The two commands of the README's quick start: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock

.PHONY: up test bench install kafka lint lock clean

# The venv holds exactly the versions in $(LOCK) (hash-checked), then the project itself without
# resolving anything. A change to the lock or to pyproject.toml re-installs; `pip check` fails
# when pyproject.toml asks for something the lock does not have (run `make lock`).
$(STAMP): $(LOCK) pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Voice needs Python 3.11+: apt-get install python3 (3.11 or newer)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r $(LOCK)
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip check
	@touch $(STAMP)

install: $(STAMP)

kafka: $(STAMP)            ## fetch the Kafka jars into the cache (once)
	$(BIN)/voice kafka fetch

up: $(STAMP)               ## run the whole stack in the foreground; Ctrl-C stops it
	$(BIN)/voice up

test: $(STAMP)             ## lint, then the whole suite (integration tests on a real broker)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/voice kafka fetch
	$(BIN)/python -m pytest -q

bench: $(STAMP)            ## print one JSON object of figures beside their baselines
	@$(BIN)/voice kafka fetch >&2
	@$(BIN)/python -m bench

lint: $(STAMP)             ## ruff, then the import walls (pyproject.toml [tool.importlinter])
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-logo

# Re-resolve the lock from pyproject.toml, keeping the current pins where they still fit
# (`make lock LOCK_FLAGS=--upgrade` moves everything to the newest allowed). Hashes cover every
# file of each pinned version, so the lock installs on any platform with Python 3.11.
# Needs only pip-tools from the current lock, not an install that matches pyproject.toml.
LOCK_FLAGS ?=
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/pip-compile || $(BIN)/pip install -q --require-hashes -r $(LOCK)
	$(BIN)/pip-compile -q --generate-hashes --extra test --strip-extras --allow-unsafe \
	    --no-emit-find-links $(LOCK_FLAGS) -o $(LOCK) pyproject.toml

clean:                ## remove the venv and the local stack's state (broker data, ClickHouse)
	rm -rf $(VENV) .state "$${VOICE_STATE_DIR:-$${XDG_STATE_HOME:-$$HOME/.local/state}/voice}"
