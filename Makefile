# Two commands on a fresh machine with only Python 3.11+ and PyPI:
#   make run   - installs into .venv on first use, then runs `importer dev`
#   make test  - installs into .venv on first use, then runs every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test test-browser unit integration openapi bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/importer dev

demo: $(STAMP)
	$(BIN)/importer dev --demo

test: $(STAMP)
	$(BIN)/python -m pytest

# The console in Debian's chromium (apt-get install -y chromium); fails when it is missing.
# IMPORTER_UPDATE_SCREENSHOT=1 make test-browser also rewrites docs/console.png.
test-browser: $(STAMP)
	IMPORTER_BROWSER_TESTS=required $(BIN)/python -m pytest tests/browser -m browser

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

openapi: $(STAMP)
	$(BIN)/importer openapi --write

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .importer-data .pytest_cache .hypothesis test-artifacts
