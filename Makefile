# Two entry points (README): `make demo` runs k3trace on the bundled H200 traces,
# `make test` runs the test suite. Both build the project-local .venv first.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
KSTAMP := $(VENV)/.kernels-cpu

.PHONY: demo test clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

# CPU builds of torch and triton run the K3 kernels' tests under the Triton interpreter.
# Best effort: without them those tests skip (the analysis needs neither).
$(KSTAMP): $(STAMP)
	-timeout 900 $(VENV)/bin/pip install -q torch==2.13.0 triton==3.6.0 'numpy<2.3' && touch $(KSTAMP)

demo: $(STAMP)
	$(VENV)/bin/k3trace demo

test: $(STAMP) $(KSTAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV)
