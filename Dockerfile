# One image for every platform process and for the provider agent.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# gcc builds the PoC verifier's AVX-512 kernels (training/poc/_simd.c) at install.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml ./
RUN pip install --no-cache-dir -e . || true
COPY . .
RUN pip install --no-cache-dir -e . && useradd --create-home proofwork && chown -R proofwork /app
USER proofwork
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
