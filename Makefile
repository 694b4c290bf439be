# Two commands on a fresh machine with only Python 3.11+ and PyPI:
#   make run   - installs into .venv on first use, then runs `importer dev`
#   make test  - installs into .venv on first use, then runs every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test test-browser unit integration faults openapi bench clean typecheck lock

# The installer's own chatter goes to $(VENV)/install.log, shown only when it fails.
# Every package, transitive ones included, comes from requirements.lock at the
# version and with the hashes it names (`make lock` refreshes it); then Importer itself.
$(STAMP): pyproject.toml requirements.lock
	@echo "installing into $(VENV) (log: $(VENV)/install.log)"
	$(PYTHON) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip > $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@$(BIN)/pip install --quiet --require-hashes -r requirements.lock >> $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@$(BIN)/pip install --quiet --no-deps -e . >> $(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	touch $(STAMP)

# Refresh requirements.lock from pyproject.toml's pins (with the test and otel extras), with
# uv in a venv of its own; commit it with the test run it passed.
UV_VERSION := 0.9.17
lock:
	$(PYTHON) -m venv $(VENV)-lock && $(VENV)-lock/bin/pip install --quiet uv==$(UV_VERSION)
	$(VENV)-lock/bin/uv pip compile pyproject.toml --extra test --extra otel --generate-hashes --universal \
	  --python-version 3.11 --quiet -o requirements.lock

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

# mypy on the import names (config: [tool.mypy] in pyproject.toml). mypy cannot
# follow the editable install's import hook nor the package-dir mapping, so it
# gets a tree of symlinks importer/{domain,handlers,adapters} in $(VENV); the
# sed turns the paths it reports back into the real ones (domain/...). The
# tree's importer/__init__.py (none at run time: a namespace package) keeps
# mypy from taking the folder handlers/console/ for the module handlers/console.py.
TYPECHECK_PATH := $(VENV)/typecheck-path
typecheck: $(STAMP)
	@rm -rf $(TYPECHECK_PATH) && mkdir -p $(TYPECHECK_PATH)/importer && touch $(TYPECHECK_PATH)/importer/__init__.py
	@for d in domain handlers adapters; do ln -s "$(CURDIR)/$$d" $(TYPECHECK_PATH)/importer/$$d; done
	@out=$$(MYPYPATH=$(TYPECHECK_PATH) $(BIN)/python -m mypy -p importer.domain -p importer.handlers -p importer.adapters 2>&1); rc=$$?; \
	  printf '%s\n' "$$out" | sed 's|^$(TYPECHECK_PATH)/importer/||'; exit $$rc

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

# Fault soak (not in CI): the fault suite again and again with new seeds for
# FAULTS_MINUTES (30); stops at the first failure. `make test` runs it once.
# FAULTS picks the scenarios, e.g. one transport:
#   make faults FAULTS="tests/faults --ignore=tests/faults/test_faults_rabbitmq.py"
#   make faults FAULTS=tests/faults/test_faults_rabbitmq.py
# Every run's [faults] lines are kept in .faults-soak.log (summed by bench/faults_summary.py).
# The default adds the cluster's master failover under a drain with the ledger exporting.
FAULTS ?= tests/faults tests/cluster/test_importer_on_cluster.py::test_a_master_sigkilled_mid_drain_fails_over_and_every_import_ends_once
faults: $(STAMP)
	@end=$$(( $$(date +%s) + $${FAULTS_MINUTES:-30} * 60 )); n=0; : > .faults-soak.log; \
	while [ $$(date +%s) -lt $$end ]; do n=$$((n + 1)); \
	  IMPORTER_FAULTS_SEED=$$n $(BIN)/python -m pytest $(FAULTS) -q -s -p no:cacheprovider > .faults.log 2>&1; rc=$$?; \
	  grep -E '^\[faults\]|passed|failed' .faults.log | tee -a .faults-soak.log; [ $$rc -eq 0 ] || { echo "run $$n failed: see .faults.log"; exit 1; }; \
	done; echo "faults: $$n runs passed" | tee -a .faults-soak.log

openapi: $(STAMP)
	$(BIN)/importer openapi --write

bench: $(STAMP)
	$(BIN)/python -m bench.suite

# A check that the bench runs (1 repetition, fewer imports, ~1-2 min); its figures are not for RESULTS.md.
.PHONY: bench-quick
bench-quick: $(STAMP)
	$(BIN)/python -m bench.suite --quick

clean:
	rm -rf $(VENV) $(VENV)-lock .importer-data .pytest_cache .hypothesis test-artifacts
