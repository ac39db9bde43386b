# A tuning worker for NVIDIA GPUs (run with the NVIDIA container toolkit).
#   docker build -f docker/tuner.Dockerfile -t kerneltune-tuner .
# torch's wheels bring their CUDA libraries and Triton its ptxas; the image adds the C compiler
# and Python headers that Triton builds its launcher stubs with at run time.
FROM nvidia/cuda:12.8.1-base-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[tune]" && rm -rf /src

RUN useradd --create-home --uid 10001 kerneltune
USER kerneltune
WORKDIR /home/kerneltune
# Triton's compilation cache, kept across runs when a volume is mounted here.
ENV TRITON_CACHE_DIR=/home/kerneltune/.triton

ENTRYPOINT ["kerneltune"]
CMD ["tune", "--preset", "common", "--workers", "1"]
