# The config service and the migration job: CPU only.
#   docker build -f docker/api.Dockerfile -t kerneltune-api .
# The kernel registry (parameter metadata, heuristic defaults) needs torch and triton. PyPI's
# torch wheel carries CUDA libraries the service never uses; to build a smaller image, point
# TORCH_INDEX_URL at a PyTorch CPU wheel index.
FROM python:3.12-slim

ARG TORCH_INDEX_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install --index-url "$TORCH_INDEX_URL" torch; fi

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[serve]" && rm -rf /src

RUN useradd --create-home --uid 10001 kerneltune
USER kerneltune
WORKDIR /home/kerneltune
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

CMD ["kerneltune", "serve", "--host", "0.0.0.0", "--port", "8000"]
