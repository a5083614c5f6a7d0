# Developer shortcuts; .ci/run and README use the same commands.
PY ?= .venv/bin/python

.PHONY: venv test test-all test-fast test-no-root demo bench clean
venv: .venv/.installed
.venv/.installed: setup.py
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test]'
	touch $@

# What CI runs: the fast path (every feature end to end, without the tests marked slow: minutes each on 2 cores)
# and the readme tier (every test that runs a command a README or doc prints, as printed, slow or not).
test: venv
	$(PY) -m pytest -q -m "not slow or readme"

test-all: venv
	$(PY) -m pytest -q

# The fast path alone.
test-fast: venv
	$(PY) -m pytest -q -m "not slow"

# make test without the tests that need root (ip netns, tc).
test-no-root: venv
	$(PY) -m pytest -q -m "(not slow or readme) and not root"

demo: venv
	bash recipes/abnet/run_local.sh

bench: venv
	for b in benchmarks/*.py; do $(PY) $$b; done

clean:
	rm -rf build dist *.egg-info .pytest_cache runs
