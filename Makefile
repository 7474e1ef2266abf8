# Two entry points (README): `make demo` runs k3trace on the bundled H200 traces,
# `make test` runs the test suite. Both build the project-local .venv first.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
KSTAMP := $(VENV)/.kernels-cpu
# CPU builds of torch and triton run the K3 kernels' tests under the Triton interpreter.
# The pair must be one pip can install together: torch 2.13.0's CUDA wheels require
# exactly triton 3.7.1 (its CPU wheel requires none), so 3.7.1 installs beside either.
TORCH := torch==2.13.0
TRITON := triton==3.7.1

.PHONY: demo test notebooks clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

# Not best effort: when the install fails, `make test` fails (the kernel tests would skip).
$(KSTAMP): $(STAMP) Makefile
	timeout 900 $(VENV)/bin/pip install -q $(TORCH) $(TRITON) 'numpy<2.3'
	$(VENV)/bin/python -c "import torch, triton; print('kernel tests: torch', torch.__version__, 'triton', triton.__version__)"
	touch $(KSTAMP)

demo: $(STAMP)
	$(VENV)/bin/k3trace demo

# K3TRACE_KERNEL_TESTS=required: tests/kernels fails, not skips, without torch and triton.
test: $(STAMP) $(KSTAMP)
	$(VENV)/bin/lint-imports
	K3TRACE_KERNEL_TESTS=required $(VENV)/bin/python -m pytest -q -n auto --dist loadfile

# Run the notebooks on the bundled traces and commit them with their outputs (the tests check
# the .ipynb files carry a run's outputs and match their scripts).
notebooks: $(STAMP)
	$(VENV)/bin/python tests/test_notebooks.py --write

clean:
	rm -rf $(VENV)
