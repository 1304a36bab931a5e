# One image for every platform process (the provider node has its own: Dockerfile.node).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# gcc builds the PoC verifier's AVX-512 kernels (training/poc/_simd.c) at install.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
# The pinned dependencies first, from pyproject.toml alone (a code change reuses this layer).
COPY pyproject.toml ./
COPY deploy/pins.py deploy/
RUN python deploy/pins.py platform > /tmp/requirements.txt && pip install --no-cache-dir -r /tmp/requirements.txt
COPY . .
RUN pip install --no-cache-dir -e '.[platform]' && useradd --create-home proofwork && chown -R proofwork /app
USER proofwork
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
