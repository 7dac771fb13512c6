# The two commands of the README's quick start: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test bench install kafka lint clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Voice needs Python 3.11+: apt-get install python3 (3.11 or newer)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

kafka: $(STAMP)            ## fetch the Kafka jars into the cache (once)
	$(BIN)/voice kafka fetch

up: $(STAMP)               ## run the whole stack in the foreground; Ctrl-C stops it
	$(BIN)/voice up

test: $(STAMP)             ## lint, then the whole suite (integration tests on a real broker)
	$(BIN)/ruff check .
	$(BIN)/voice kafka fetch
	$(BIN)/python -m pytest -q

bench: $(STAMP)            ## print one JSON object of figures beside their baselines
	@$(BIN)/voice kafka fetch >&2
	@$(BIN)/python -m bench

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .state
