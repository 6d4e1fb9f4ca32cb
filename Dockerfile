# tandem on a CPU: the bundled model (or --model DIR / org/name) behind the OpenAI API on port 8000.
#   docker build -t tandem .
#   docker run --rm -p 8000:8000 tandem                       # the bundled model, the default recipe
#   docker run --rm -p 8000:8000 -e TANDEM_API_KEY=secret tandem --recipe int8
# Arguments after the image name are `tandem serve` flags. Runs as a non-root user; SIGTERM drains.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# gcc builds tandem's C kernels for the CPU the container runs on (cached per CPU in the user's home).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc=4:12.* libc6-dev=2.36-* \
    && rm -rf /var/lib/apt/lists/*

# torch first, from the CPU index: the default index would pull a CUDA build of several GB.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . && rm -rf /build

RUN useradd --create-home --uid 10001 tandem
USER 10001
WORKDIR /home/tandem
# Build the kernels now for this CPU; another CPU rebuilds them once on first use (keyed by its flags).
RUN python -m tandem.kernels

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tandem", "serve", "--host", "0.0.0.0", "--port", "8000"]
