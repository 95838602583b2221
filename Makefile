# The one place to learn how to run things.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EMBEDRANK_DATA ?= $(abspath ../shared/data)
export EMBEDRANK_DATA
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup run test test-fast lint typecheck bench bench-encode bench-rerank bench-service bench-fairness bench-load fuzz eval serve notebooks clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first, from the CPU wheel (never let a resolver pick a multi-GB CUDA build)
	$(PIP) install -q -c constraints.txt "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[dev,notebooks,train,ray,int8,onnx]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

setup: $(VENV)/.installed

run: setup  ## the main job on the embedded defaults: a BEIR evaluation of the packaged model on the demo collection
	$(PY) eval/run.py

test: setup lint typecheck  ## lint, type check, then the whole default suite (doctests, parity, service, data, notebooks)
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow and not notebooks"

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

bench: bench-encode bench-rerank bench-service bench-fairness

bench-encode: setup
	$(PY) eval/bench_encode.py

bench-rerank: setup
	$(PY) eval/bench_rerank.py

bench-service: setup
	$(PY) eval/bench_service.py --servers default int8 infinity --clients 32 --rounds 2

bench-fairness: setup
	$(PY) eval/bench_fairness.py

bench-load: setup
	$(PY) eval/bench_load.py

fuzz: setup  ## schemathesis --checks all, 1,000 fuzzing cases per operation (the suite runs 100)
	$(PY) eval/fuzz_api.py

eval: setup  ## the reference benchmarks on ../shared/data
	$(PY) eval/run.py scifact --retriever dense
	$(PY) eval/run.py scifact --retriever bm25
	$(PY) eval/run.py scifact --retriever hybrid
	$(PY) eval/run.py trec-dl19-passage-bm25top100 --retriever bm25
	$(PY) eval/run.py trec-dl19-passage-bm25top100 --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2

serve: setup
	$(VENV)/bin/litestar run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
