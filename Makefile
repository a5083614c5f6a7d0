# Developer shortcuts; .ci/run and README use the same commands.
PY ?= .venv/bin/python

.PHONY: venv test test-all test-fast test-no-root demo bench clean
venv: .venv/.installed
.venv/.installed: setup.py
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test]'
	touch $@

# The fast path: every feature end to end, without the tests marked slow (minutes each on 2 cores).
test: venv
	$(PY) -m pytest -q -m "not slow"

test-all: venv
	$(PY) -m pytest -q

test-fast: test

test-no-root: venv
	$(PY) -m pytest -q -m "not root"

demo: venv
	bash recipes/abnet/run_local.sh

bench: venv
	for b in benchmarks/*.py; do $(PY) $$b; done

clean:
	rm -rf build dist *.egg-info .pytest_cache runs
