# The one place to learn how to run things.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export TOKENIZERS_PARALLELISM ?= false
# the tests and the main job run offline (the packaged model); `make serve` may load hub models
OFFLINE := HF_HUB_OFFLINE=1
# torch's CPU build: on Linux, PyPI's torch is a CUDA build of several GB; PyTorch's CPU index has the CPU one
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

EXTRAS := dev,notebooks,train,ray,int8,onnx,docs,clients,sparse,postgres,pgvector
RECORD := $(PY) -m eval record

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= embedrank:$(VERSION)
BASE_IMAGE ?= python:3.11-slim-bookworm
IMAGE_ARCH := $(shell uname -m | sed 's/arm64/aarch64/')

.PHONY: image image-base image-check image-parity setup setup-tests lock run test test-fast test-avx2 test-extended lint typecheck docs bench $(addprefix bench-,$(BENCH_ALIASES)) bench-encode-avx2 bench-calibration-avx2 eval-auto-avx2 gpu-bundle fuzz eval eval-store support-matrix serve notebooks clean

# constraints.txt is the lock: every package version the test suite ran with (make lock refreshes it)
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first, the CPU build from PyTorch's index (a local wheel in find-links also serves); its own
	# dependencies come with the next step, which keeps the installed torch
	$(PIP) install -q --no-deps -c constraints.txt --index-url $(TORCH_INDEX) "torch==2.13.0"
	$(PIP) install -q -c constraints.txt -e ".[$(EXTRAS)]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# PyLate, the ColBERT reference of the parity tests, pins sentence-transformers 5.3: its own environment
PYLATE_VENV := .venv-pylate
$(PYLATE_VENV)/.installed: tests/reference/pylate.txt constraints.txt
	$(PYTHON) -m venv $(PYLATE_VENV)
	$(PYLATE_VENV)/bin/python -m pip install -q --no-deps -c constraints.txt --index-url $(TORCH_INDEX) "torch==2.13.0"
	$(PYLATE_VENV)/bin/python -m pip install -q --no-deps -r tests/reference/pylate.txt
	touch $@

setup: $(VENV)/.installed  ## the main environment (.venv): what make run, the library and the service need

setup-tests: setup $(PYLATE_VENV)/.installed  ## also the test-only PyLate environment (.venv-pylate)

lock:  ## resolve the newest allowed versions in a fresh environment, write them to constraints.txt, run the suite on them
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --no-deps --index-url $(TORCH_INDEX) "torch==2.13.0"
	.venv-lock/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	{ echo "# The lock: every package version the test suite ran with. Refresh with make lock (which re-runs the suite)."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed -E 's/^torch==([0-9.]+)\+cpu$$/torch==\1/'; } > constraints.txt
	rm -rf .venv-lock $(VENV)
	$(MAKE) test

run: setup  ## the main job on the embedded defaults: a BEIR evaluation of the packaged model on the demo collection
	$(OFFLINE) $(PY) eval/run.py

# the suite's worker processes (pytest-xdist): many tests wait on servers and subprocesses, so two workers
# finish sooner on two cores; PYTEST_WORKERS=0 runs it in one process
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS)

test: setup-tests lint typecheck  ## lint, type check, then the whole default suite (doctests, parity, service, data, notebooks)
	$(OFFLINE) $(PYTEST)

# the tests whose outcome can depend on the CPU's kernels (--kernel-pass: those of the layers that compute not marked
# kernel_free, and those above marked kernels; tests/conftest.py), as on an AVX2-only CPU without bf16, with
# AVX2_LOAD busy loops beside them (tests/as_avx2.sh)
AVX2_LOAD ?= 0
test-avx2: setup-tests
	tests/as_avx2.sh --load $(AVX2_LOAD) env $(OFFLINE) $(PYTEST) -m "not extended" --kernel-pass

test-extended: setup-tests  ## the benchmark-sized checks the default run leaves out (pytest -m extended)
	$(OFFLINE) $(PYTEST) -m extended

test-fast: setup
	$(OFFLINE) $(PYTEST) -m "not slow and not notebooks"

docs: setup  ## the manual, built strictly into build/site (the suite builds it too)
	$(VENV)/bin/mkdocs build --strict

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

# every benchmark and quality record, by name (python -m eval bench --list names them): make bench NAME=encode runs
# it through the recorder into eval/results/encode.json (its command, date, commit, CPU and output) and renders the
# docs' pages from eval/results/; ARGS="..." runs it with other arguments than the recorded ones
bench: setup  ## a benchmark by name, recorded: make bench NAME=encode (without NAME: the list)
	$(if $(NAME),$(RECORD) $(NAME) $(ARGS),$(PY) -m eval bench --list)

eval: setup  ## the reference evaluations on $$EMBEDRANK_DATA (else the user's data directory), recorded for the benchmarks page
	$(RECORD) quality
	$(RECORD) quality-dl19
	$(RECORD) quantization

eval-store: setup  ## search through a served vector store against the library's runs on $$EMBEDRANK_DATA (dense, BM25, hybrid; SPLADE)
	$(RECORD) quality-store
	$(RECORD) quality-store-splade

gpu-bundle: setup  ## what a GPU machine with only PyTorch and sentence-transformers needs carried: build/gpu
	$(PY) -m eval bench gpu --prepare build/gpu

fuzz: setup  ## schemathesis --checks all, 1,000 fuzzing cases per operation (the suite runs 100)
	$(PY) -m eval.fuzz.api

# the former targets of single records, kept for one release: make bench-encode is make bench NAME=encode
BENCH_ALIASES := encode encode-streams calibration int8-layers ov-hints rerank service tracing span-cost batch \
  batch-owners batch-validation hostile-files vector-store store-filters store-index pgvector fairness ready gpu load \
  index-memory images
$(addprefix bench-,$(BENCH_ALIASES)): bench-%:
	@$(MAKE) --no-print-directory bench NAME=$*
bench-encode-avx2:
	@$(MAKE) --no-print-directory bench NAME=encode-avx2-emulated
bench-calibration-avx2:
	@$(MAKE) --no-print-directory bench NAME=calibration-avx2-emulated
eval-auto-avx2:
	@$(MAKE) --no-print-directory bench NAME=quality-auto-avx2-emulated
support-matrix:
	@$(MAKE) --no-print-directory bench NAME=support
image-parity:
	@$(MAKE) --no-print-directory bench NAME=image-parity

notebooks: setup  ## re-execute the notebooks in full mode, in place, so the committed outputs carry every figure
	$(PY) eval/execute_notebooks.py

image:  ## the service's container image (CPU torch, the locked versions, the packaged model), tagged embedrank:<version>
	rm -rf build/image/wheels && mkdir -p build/image/wheels
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
	  --platform manylinux_2_28_$(IMAGE_ARCH) --index-url $(TORCH_INDEX) -d build/image/wheels "torch==2.13.0"
	docker build --force-rm --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

image-base:  ## a base image from Debian 12's packages, for machines that reach no image registry (mmdebstrap)
	docker/debian-base.sh embedrank-base:bookworm $(CA_BUNDLE)

image-check: setup  ## start the image, wait for readiness, embed, rerank, stop; record size and time to ready
	$(RECORD) container --title "Container image: size, time to ready and stop" -- $(PY) eval/check_image.py --image $(IMAGE) --starts 3

serve: setup
	$(VENV)/bin/litestar run

clean:
	rm -rf $(VENV) $(PYLATE_VENV) .pytest_cache .ruff_cache .mypy_cache build
