# Two entry points (README): `make demo` runs k3trace on the bundled H200 traces,
# `make test` runs the test suite. Both build the project-local .venv first.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/k3trace demo

test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV)
