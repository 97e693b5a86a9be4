# `make test` and `make bench` set everything up on a fresh clone: a .venv with gradcore in it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of PyTorch, for the side-by-side figures (skipped if it cannot be installed).
TORCH  ?= torch==2.13.0

.PHONY: test bench bench-distributed demo venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@# the multi-process tests run real mpiexec (MPICH's wheel); without it they are skipped
	$(PY) -m pip install -q -e '.[mpi]' \
	  || echo 'note: mpi4py/MPICH could not be installed; the multi-process tests will be skipped'
	$(PY) -m pip install -q -e '.[dask]' \
	  || echo 'note: Dask could not be installed; the Dask tests will be skipped'
	@# CuPy imports without a GPU: the suite checks every xp.<name> it uses exists in CuPy.
	$(PY) -c 'import cupy' 2>/dev/null || $(PY) -m pip install -q cupy-cuda12x \
	  || echo 'note: CuPy could not be installed; the CuPy name check will be skipped'
	touch $@

test: venv
	$(PY) -m pytest -q

$(VENV)/.bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q '$(TORCH)' \
	  || echo 'note: PyTorch could not be installed; benchmarks run without it'
	touch $@

# Results go to benchmarks/results/local/ (ignored by git); ARGS="--only chain --repeat 3",
# ARGS=--publish to update the committed benchmarks/RESULTS.md and benchmarks/results/.
bench: $(VENV)/.bench
	$(PY) -m benchmarks $(ARGS)

# Data-parallel training on 2 ranks (mpiexec from the mpi extra) against mpi4py and PyTorch DDP;
# ARGS="--quick", ARGS="--json FILE".
bench-distributed: $(VENV)/.bench
	$(VENV)/bin/mpiexec -n 2 $(PY) -m benchmarks.distributed $(ARGS)

# matplotlib draws the demo's PNGs (the `demo` extra); ARGS="--task conv --device cpu" etc.
$(VENV)/.demo: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

demo: $(VENV)/.demo
	$(PY) -m gradcore.demo $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
