# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit venv clean docs bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check peerd tests examples tools bench
	$(VENV)/bin/ruff format --check peerd tests examples tools bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(PY) tools/gen_cli_docs.py

unit: $(STAMP)
	$(VENV)/bin/pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(PY) bench/follower.py

demo: $(STAMP)
	$(PY) examples/demo.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
