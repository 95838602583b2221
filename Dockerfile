# The embedrank HTTP service on the CPU: the locked versions, the packaged model and its OpenVINO export
# baked in, a non-root user, a health check. Build with `make image` (which puts the CPU build of torch in
# build/image/wheels first), or by hand:
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm -t embedrank .
# BASE_IMAGE is any Debian-like image with python3 (3.11+) and its venv module.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/embedrank
COPY build/image/wheels/ /tmp/wheels/
# torch first, the CPU build (never PyPI's CUDA build), then everything else at the versions of the lock
RUN /opt/embedrank/bin/pip install -q --no-deps /tmp/wheels/torch-*.whl
COPY pyproject.toml README.md constraints.txt app.py /src/
COPY embedrank/ /src/embedrank/
COPY service/ /src/service/
RUN /opt/embedrank/bin/pip install -q -c /src/constraints.txt "/src[int8,onnx,postgres]" \
    && /opt/embedrank/bin/pip check \
    && /opt/embedrank/bin/python -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 'torch is a CUDA build')"

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
LABEL org.opencontainers.image.title="embedrank" \
      org.opencontainers.image.description="Text embeddings and reranking over HTTP (OpenAI, Cohere and TEI APIs), CPU" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
ENV PATH=/opt/embedrank/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EMBEDRANK_CACHE=/var/cache/embedrank \
    HOME=/var/cache/embedrank
COPY --from=build /opt/embedrank /opt/embedrank
COPY app.py /srv/embedrank/app.py
RUN useradd --uid 10001 --user-group --no-log-init --home-dir /var/cache/embedrank --create-home embedrank
USER embedrank
WORKDIR /srv/embedrank
# the packaged model's OpenVINO export and its int8/uint8 range sample, made now so that a container is ready
# seconds after it starts
RUN HF_HUB_OFFLINE=1 python -c "from embedrank import Encoder; e = Encoder.from_pretrained(); e.encode(['warm up']); e.quantization_ranges()"
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
# one process by default; EMBEDRANK_FRONTS=N serves as a replica of N front processes and an engine process
CMD ["python", "-m", "service", "--host", "0.0.0.0", "--port", "8000"]
