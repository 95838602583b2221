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
RECORD := $(PY) eval/record.py

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= embedrank:$(VERSION)
BASE_IMAGE ?= python:3.11-slim-bookworm
IMAGE_ARCH := $(shell uname -m | sed 's/arm64/aarch64/')

.PHONY: image image-base image-check image-parity bench-images setup setup-tests lock run test test-fast test-avx2 test-extended lint typecheck docs bench bench-encode bench-encode-avx2 bench-calibration bench-calibration-avx2 bench-int8-layers bench-ov-hints bench-encode-streams eval-auto-avx2 bench-rerank bench-service bench-tracing bench-span-cost bench-batch-owners bench-batch-validation bench-hostile-files bench-vector-store bench-store-index bench-store-filters bench-pgvector bench-fairness bench-ready bench-batch bench-gpu gpu-bundle bench-load bench-index-memory fuzz eval eval-store support-matrix serve notebooks clean

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

# the tests whose outcome can depend on the CPU's kernels (all but those marked kernel_free: fakes, HTTP,
# databases, settings), as on an AVX2-only CPU without bf16, with AVX2_LOAD busy loops beside them (tests/as_avx2.sh)
AVX2_LOAD ?= 0
test-avx2: setup-tests
	tests/as_avx2.sh --load $(AVX2_LOAD) env $(OFFLINE) $(PYTEST) -m "not extended and not kernel_free"

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

bench: bench-encode bench-calibration bench-rerank bench-service bench-tracing bench-fairness bench-ready bench-batch bench-batch-owners bench-batch-validation bench-vector-store bench-store-index bench-images

# each benchmark records its output, command, date, commit and CPU in eval/results/; the docs' page is rendered from them
bench-encode: setup
	$(RECORD) encode "Encoding speed by backend and precision (in-process)" -- $(PY) eval/bench_encode.py --rounds 2 --systems torch:fp32 openvino:fp32 openvino:bf16 openvino:int8 onnx:fp32 onnx:int8 auto:auto
	$(PY) eval/render_benchmarks.py

# the same on this CPU with OpenVINO's, oneDNN's and torch's kernels held to AVX2 (tests/as_avx2.sh; ONNX Runtime's are not)
bench-encode-avx2: setup
	tests/as_avx2.sh $(RECORD) encode-avx2-emulated "Encoding speed with kernels held to AVX2 (in-process)" -- $(PY) eval/bench_encode.py --rounds 2 --systems torch:fp32 openvino:fp32 openvino:int8 onnx:fp32 onnx:int8 auto:auto
	$(PY) eval/render_benchmarks.py

# which sample int8 is calibrated and judged on: vocabulary sentences, the packaged sample, SciFact
bench-calibration: setup
	$(RECORD) calibration "int8 calibration samples side by side" -- $(PY) eval/bench_calibration.py
	$(PY) eval/render_benchmarks.py

bench-int8-layers: setup  ## ONNX int8's most sensitive layers, and what keeping them in fp32 buys and costs (8- and 7-bit weights)
	$(RECORD) int8-layers "ONNX int8: the most sensitive layers kept in fp32, side by side" -- $(PY) eval/bench_int8_layers.py --keep 1 2 4
	$(PY) eval/render_benchmarks.py

bench-ov-hints: setup  ## OpenVINO's LATENCY hint (embedrank's) against THROUGHPUT with each batch split across its streams
	$(RECORD) ov-hints "OpenVINO's performance hints side by side" -- $(PY) eval/bench_ov_hints.py
	$(PY) eval/render_benchmarks.py

bench-encode-streams: setup  ## Encoder.encode with OpenVINO's streams=2 against one stream, fp32 and int8
	$(RECORD) encode-streams "Encoding speed with OpenVINO's streams (in-process)" -- $(PY) eval/bench_encode.py --rounds 2 --queries 1000 --passages 500 --systems openvino:fp32 openvino:fp32:streams=2 openvino:int8 openvino:int8:streams=2
	$(PY) eval/render_benchmarks.py

bench-calibration-avx2: setup  ## the same with kernels held to AVX2: ONNX int8's 7-bit weights compute the integers AVX2 would
	tests/as_avx2.sh $(RECORD) calibration-avx2-emulated "int8 calibration samples side by side, kernels held to AVX2" -- $(PY) eval/bench_calibration.py
	$(PY) eval/render_benchmarks.py

eval-auto-avx2: setup  ## SciFact with backend and precision auto, kernels held to AVX2 (ONNX int8 then has 7-bit weights)
	tests/as_avx2.sh $(RECORD) quality-auto-avx2-emulated "Retrieval quality with auto, kernels held to AVX2" -- $(PY) eval/run.py scifact --retriever dense --backend auto --precision auto --metrics ndcg@10 recall@100
	$(PY) eval/render_benchmarks.py

bench-rerank: setup
	$(RECORD) rerank "Cross-encoder scoring speed by backend (in-process)" -- $(PY) eval/bench_rerank.py --rounds 2
	$(PY) eval/render_benchmarks.py

bench-service: setup
	$(RECORD) service "HTTP service throughput against in-process encoding" -- $(PY) eval/bench_service.py --servers default int8 --clients 32 --rounds 2
	$(PY) eval/render_benchmarks.py

bench-tracing: setup
	$(RECORD) tracing "Tracing's cost: every request traced and exported against no tracing" -- $(PY) eval/bench_service.py --servers default traced --clients 32 --rounds 4
	$(PY) eval/render_benchmarks.py

bench-span-cost: setup  ## what tracing's spans cost a one-query request in CPU, the service's tracing code alone
	$(RECORD) span-cost "Tracing's CPU per one-query request, the service's tracing code alone" -- $(PY) eval/bench_span_cost.py
	$(PY) eval/render_benchmarks.py

bench-batch-owners: setup
	$(RECORD) batch-owners "Batch jobs of two keys: a small batch beside another key's large ones" -- $(PY) eval/bench_batch_owners.py
	$(PY) eval/render_benchmarks.py

bench-batch-validation: setup
	$(RECORD) batch-validation "Validating a batch's input file: memory and the event loop" -- $(PY) eval/bench_batch_validation.py
	$(PY) eval/render_benchmarks.py

bench-hostile-files: setup  ## one key's PDF bombs attached to a store: the other key's latency, memory, SIGTERM, restart
	$(RECORD) hostile-files "Vector stores: one key's hostile PDFs and another key's calls" -- $(PY) eval/bench_hostile_files.py
	$(PY) eval/render_benchmarks.py

bench-vector-store: setup  ## vector stores: SciFact read into a store, searches at 1 and 16 clients, memory per chunk
	$(RECORD) vector-store "Vector stores: ingestion, search latency, memory per chunk" -- $(PY) eval/bench_vector_store.py
	$(PY) eval/render_benchmarks.py

bench-store-filters: setup  ## a vector store's search with an attribute filter against without, every first stage
	$(RECORD) store-filters "Vector stores: filtered against unfiltered search, every first stage" -- $(PY) eval/bench_store_filters.py
	$(PY) eval/render_benchmarks.py

bench-store-index: setup  ## a vector store's dense search, exact against HNSW, by the number of chunks
	$(RECORD) store-index "Vector stores: exact against HNSW search by store size" -- $(PY) eval/bench_store_index.py
	$(PY) eval/render_benchmarks.py

bench-pgvector: setup  ## a store's dense search inside PostgreSQL with pgvector against the replica's own index
	$(RECORD) pgvector "Vector stores: pgvector in PostgreSQL against the replica's own index" -- $(PY) eval/bench_pgvector.py
	$(PY) eval/render_benchmarks.py

bench-fairness: setup
	$(RECORD) fairness "Fairness: small requests during a bulk request" -- $(PY) eval/bench_fairness.py
	$(PY) eval/render_benchmarks.py

bench-ready: setup  ## time from `litestar run` to ready: a first start on an empty cache, then later starts
	$(RECORD) ready "Time to ready: first start and later starts" -- $(PY) eval/bench_ready.py
	$(PY) eval/render_benchmarks.py

bench-batch: setup
	$(RECORD) batch "Batch jobs: throughput, fairness to direct requests, the embedding cache" -- $(PY) eval/bench_batch.py
	$(PY) eval/render_benchmarks.py

bench-gpu: setup  ## on a machine with a CUDA GPU: parity, encode speed, forward rate, the service
	$(RECORD) gpu "GPU: parity, encode speed, the forward pass's matrix rate, the service" -- $(PY) eval/bench_gpu.py --device cuda
	$(PY) eval/render_benchmarks.py

gpu-bundle: setup  ## what a GPU machine with only PyTorch and sentence-transformers needs carried: build/gpu
	$(PY) eval/bench_gpu.py --prepare build/gpu

bench-load: setup
	$(RECORD) load "Load: 64 clients, mixed requests" -- $(PY) eval/bench_load.py
	$(PY) eval/render_benchmarks.py

bench-index-memory: setup
	$(RECORD) index-memory "Index memory per vector, built from shards" -- $(PY) eval/bench_index_memory.py --vectors 1000000 --shard-size 100000
	$(PY) eval/render_benchmarks.py

fuzz: setup  ## schemathesis --checks all, 1,000 fuzzing cases per operation (the suite runs 100)
	$(PY) eval/fuzz_api.py

eval: setup  ## the reference evaluations on $EMBEDRANK_DATA (else the user's data directory), recorded for the benchmarks page
	$(RECORD) quality "Retrieval quality: SciFact, NFCorpus and Cranfield, dense, BM25 and hybrid" -- \
	  $(PY) eval/run.py scifact nfcorpus-preprocessed-partial cranfield --retriever dense bm25 hybrid --metrics ndcg@10 recall@100
	$(RECORD) quality-dl19 "Retrieval quality: TREC DL19, BM25 and BM25 reranked" -- \
	  $(PY) eval/run.py trec-dl19-passage-bm25top100 --retriever bm25 --reranker sentence-transformers/all-MiniLM-L6-v2
	$(RECORD) quantization "Compact vectors: quality of each embedding type" -- $(PY) eval/bench_quantization.py scifact
	$(PY) eval/render_benchmarks.py

eval-store: setup  ## search through a served vector store against the library's runs on $EMBEDRANK_DATA (dense, BM25, hybrid; SPLADE)
	$(RECORD) quality-store "Quality through a served vector store, against the library's own runs" -- \
	  $(PY) eval/run.py scifact nfcorpus-preprocessed-partial cranfield --dense-windows --bm25-windows --retriever dense bm25 hybrid \
	  --served-store local --served-first-stage dense bm25 hybrid --served-chunking static:254:32
	$(RECORD) quality-store-splade "SPLADE through a served vector store against the library (SciFact)" -- \
	  $(PY) eval/run.py scifact --dense-windows --bm25-windows --retriever dense bm25 splade hybrid:bm25+dense+splade \
	  --served-store local --served-first-stage splade hybrid --served-hybrid-weights dense=1 bm25=1 splade=1 \
	  --served-chunking static:254:32
	$(PY) eval/render_benchmarks.py

bench-images: setup  ## images per second of CLIP and SigLIP against sentence-transformers, in-process and served (docs/benchmarks.md)
	$(RECORD) images "Image embeddings: images per second against sentence-transformers" -- $(PY) eval/bench_images.py
	$(PY) eval/render_benchmarks.py

image-parity: setup  ## CLIP, SigLIP and SigLIP2 by tower and backend against sentence-transformers (docs/models.md)
	$(RECORD) image-parity "Image-text models: towers by backend against sentence-transformers" -- $(PY) eval/image_parity.py
	$(PY) eval/render_benchmarks.py

support-matrix: setup  ## every architecture on every backend and precision against sentence-transformers (docs/models.md)
	$(RECORD) support "Support matrix: architectures by backend and precision" -- $(PY) eval/support_matrix.py
	$(PY) eval/render_benchmarks.py

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
	$(RECORD) container "Container image: size, time to ready and stop" -- $(PY) eval/check_image.py --image $(IMAGE) --starts 3
	$(PY) eval/render_benchmarks.py

serve: setup
	$(VENV)/bin/litestar run

clean:
	rm -rf $(VENV) $(PYLATE_VENV) .pytest_cache .ruff_cache .mypy_cache build
