# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: bytecode demo test lint typecheck unit venv clean docs bench clis conformance sandbox faults fuzz chromium mutants console-shots

# One line before each slow step; pip -qq prints errors only (not its build backends' warnings).
$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "make: creating the virtual environment $(VENV) ($(PYTHON) -m venv)"; $(PYTHON) -m venv $(VENV); }
	@echo "make: upgrading pip in $(VENV)"
	@$(PY) -m pip install -qq --disable-pip-version-check --upgrade pip
	@echo "make: installing peerd and its dependencies into $(VENV) (pip install -e '.[test]'; about a minute the first time)"
	@$(PY) -m pip install -qq --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# The real coder CLIs (pinned by tests/coder-clis/package-lock.json) that the provider tests run
# offline against a scripted fake model. A failed install fails `make test` with npm's reason.
CLIS := .cache/coder-clis
CLIS_STAMP := $(CLIS)/.installed
$(CLIS_STAMP): tests/coder-clis/package.json tests/coder-clis/package-lock.json
	@echo "make: installing the pinned coder CLIs into $(CLIS) (npm ci; a minute or two the first time)"
	@mkdir -p $(CLIS)
	@cp tests/coder-clis/package.json tests/coder-clis/package-lock.json $(CLIS)/
	@cd $(CLIS) && npm ci --no-audit --no-fund --loglevel=error
	@touch $(CLIS_STAMP)

clis: $(CLIS_STAMP)

# The MCP conformance suite (pinned by tests/mcp-conformance/package-lock.json) that
# tests/integration/test_mcp_conformance.py runs against a real daemon's /mcp. Installed like the
# CLIs: npm ci from the lockfile, once; a failed install fails `make test` with npm's reason.
CONFORMANCE := .cache/mcp-conformance
CONFORMANCE_STAMP := $(CONFORMANCE)/.installed
$(CONFORMANCE_STAMP): tests/mcp-conformance/package.json tests/mcp-conformance/package-lock.json
	@echo "make: installing the pinned MCP conformance suite into $(CONFORMANCE) (npm ci)"
	@mkdir -p $(CONFORMANCE)
	@cp tests/mcp-conformance/package.json tests/mcp-conformance/package-lock.json $(CONFORMANCE)/
	@cd $(CONFORMANCE) && npm ci --no-audit --no-fund --loglevel=error
	@touch $(CONFORMANCE_STAMP)

conformance: $(CONFORMANCE_STAMP)

# peerd confines the runs it starts with bubblewrap (bwrap); the tests and the demo's linked runs
# need it. Installed here when missing and we are root with apt-get; otherwise one line says so.
sandbox:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "Installing bubblewrap: peerd confines the runs it starts with it."; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
			{ apt-get update -qq && apt-get install -y -qq bubblewrap; }; \
	else \
		echo "bubblewrap (bwrap) is not installed: linked machines' runs above read-only will be refused (install it: sudo apt-get install bubblewrap)."; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check peerd tests examples tools bench
	$(VENV)/bin/ruff format --check peerd tests examples tools bench
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The screenshots docs/user/console.md shows (docs/user/console/*.png): the console's browser tests,
# run with PEERD_CONSOLE_DOC_SHOTS=1, write them (tests/support/console.py:DOC_SHOTS lists them).
console-shots: $(STAMP)
	PEERD_CONSOLE_DOC_SHOTS=1 $(VENV)/bin/pytest tests/console -q -p no:randomly

docs: $(STAMP)
	$(PY) tools/gen_cli_docs.py
	$(PY) tools/gen_tool_facts.py
	$(PY) tools/gen_openapi.py
	$(PY) tools/gen_answer_fields.py

# The console's browser tests (tests/console) drive Debian's chromium through Playwright (it
# cannot download its own browsers here). Installed when missing and we are root with apt-get;
# otherwise `make test` stops with the one command to run.
chromium:
	@if command -v chromium >/dev/null 2>&1 || [ -n "$$PEERD_CHROMIUM" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make: installing chromium (apt-get): the console's browser tests drive it."; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq chromium >/dev/null 2>&1 || \
			{ apt-get update -qq && apt-get install -y -qq chromium; } || \
			{ echo "make: chromium could not be installed; install it with: apt-get install -y chromium"; exit 1; }; \
	else \
		echo "make: the console's browser tests need Chromium; install it with: sudo apt-get install -y chromium"; \
		exit 1; \
	fi

# Every test but the fault suite (tests/faults: kill -9 matrices, outages, full disks, SIGTERM
# rows, about a fifth of the time), which `make faults` runs in full.
# Bytecode for peerd's own modules first: an editable install has none, and where the environment
# sets PYTHONDONTWRITEBYTECODE (this machine's does) every daemon, CLI and scripted coder the suite
# starts would compile ~300 modules from source again (0.6 s of each daemon's start here).
bytecode: $(STAMP)
	@PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q -j 0 peerd

unit: $(STAMP) $(CLIS_STAMP) $(CONFORMANCE_STAMP) sandbox chromium bytecode
	$(VENV)/bin/pytest -q --ignore=tests/faults

test: lint typecheck unit

# The API fuzzed at length: the same schemathesis tests `make test` runs (tests/fuzz, both listeners
# of a real daemon, 10 requests per operation there) with PEERD_FUZZ_EXAMPLES per operation and the
# coverage phase (boundary values of every field); PEERD_FUZZ_SEED picks another sequence. Also the
# worktree property test (what a snapshot or commit takes) with PEERD_FUZZ_EXAMPLES new examples.
FUZZ_EXAMPLES ?= 100
fuzz: $(STAMP) sandbox
	PEERD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) PEERD_FUZZ_COVERAGE=1 $(VENV)/bin/pytest -q -p no:cacheprovider tests/fuzz \
		tests/handoff/test_snapshot_property.py

# The fault suite in full (tests/faults, real daemons, bounded): the kill -9 matrix with
# PEERD_FAULT_TRIALS kills at random moments (seed PEERD_FAULT_SEED), outages through a proxy
# (refused, black hole), full disks, damaged stores, SIGTERM; it prints its table at the end.
# `make test` runs its short, deterministic subset.
faults: $(STAMP) sandbox bytecode
	PEERD_FAULTS=full $(VENV)/bin/pytest -q -p no:cacheprovider tests/faults

# Mutation checks: each critical rule of tools/mutants.toml broken on purpose, one at a time in a
# scratch copy; every test it names must then fail (a few minutes; not part of `make test`).
mutants: $(STAMP) sandbox
	$(PY) tools/mutants.py

bench: $(STAMP) bytecode
	$(PY) bench/wake.py
	$(PY) bench/cli_start.py
	$(PY) bench/mcp_start.py
	$(PY) bench/store_hops.py
	$(PY) bench/launch.py && $(PY) bench/start.py && $(PY) bench/resume.py
	$(PY) bench/placement.py
	$(PY) bench/fleet.py

# DEMO_PROVIDER=claude or codex runs the demo's agents as that real CLI against a scripted model.
demo: $(STAMP) sandbox bytecode $(if $(filter claude codex,$(DEMO_PROVIDER)),$(CLIS_STAMP))
	$(PY) examples/demo.py

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache
