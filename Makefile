# Developer shortcuts; .ci/run and README use the same commands.
PY ?= .venv/bin/python
NLP_PY ?= .venv-nlp/bin/python
# PaddleNLP's tests run in .venv-nlp: PaddleNLP 2.8.1's pins exclude PaddleFormers' (setup.py, the nlp extra); the
# main environment leaves them out rather than skipping them
NLP_TESTS = tests/llm/test_paddlenlp_bases.py

.PHONY: venv venv-nlp test test-nlp test-all test-fast test-no-root demo bench clean
# The extras CI installs, so the suite runs what CI runs instead of skipping it: test, and formers (PaddleFormers'
# models of tests/llm, VisualDL's scalars). The stamp depends on this file too: a change of what is installed
# reinstalls.
venv: .venv/.installed
.venv/.installed: setup.py Makefile
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test,formers]'
	.venv/bin/python -c "import paddleformers, visualdl"
	touch $@

venv-nlp: .venv-nlp/.installed
.venv-nlp/.installed: setup.py Makefile
	python3 -m venv .venv-nlp
	.venv-nlp/bin/pip install -q --upgrade pip
	.venv-nlp/bin/pip install -q -e '.[nlp,test]'
	.venv-nlp/bin/python -c "import paddlenlp"
	touch $@

# What CI runs: the fast path (every feature end to end, without the tests marked slow: minutes each on 2 cores)
# and the readme tier (every test that runs a command a README or doc prints, as printed, slow or not), then
# PaddleNLP's tests in their own environment.
test: venv venv-nlp
	$(PY) -m pytest -q -m "not slow or readme" --ignore=$(NLP_TESTS)
	$(NLP_PY) -m pytest -q $(NLP_TESTS)

# PaddleNLP's tests alone.
test-nlp: venv-nlp
	$(NLP_PY) -m pytest -q $(NLP_TESTS)

test-all: venv venv-nlp
	$(PY) -m pytest -q --ignore=$(NLP_TESTS)
	$(NLP_PY) -m pytest -q $(NLP_TESTS)

# The fast path alone.
test-fast: venv
	$(PY) -m pytest -q -m "not slow" --ignore=$(NLP_TESTS)

# make test without the tests that need root (ip netns, tc).
test-no-root: venv venv-nlp
	$(PY) -m pytest -q -m "(not slow or readme) and not root" --ignore=$(NLP_TESTS)
	$(NLP_PY) -m pytest -q $(NLP_TESTS)

demo: venv
	bash recipes/abnet/run_local.sh

bench: venv
	for b in benchmarks/*.py; do $(PY) $$b; done

clean:
	rm -rf build dist *.egg-info .pytest_cache runs
