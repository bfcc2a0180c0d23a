# syntax=docker/dockerfile:1
# Sluice, the Kafka throttling proxy. The analytics extra (PySpark) is not in this image: the
# Spark jobs run with spark-submit on a Spark cluster.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# a C compiler for the compiled data plane (protocol/_speedups.pyx, built by setup.py); only in
# this stage: the final image gets the built extension, not the compiler
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/sluice
ENV PATH=/opt/sluice/bin:$PATH
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY proxy/ proxy/
COPY protocol/ protocol/
COPY quotas/ quotas/
COPY spark_analytics/ spark_analytics/
COPY contracts/ contracts/
RUN pip install --no-compile .

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Kafka-protocol throttling proxy with Kafka's quota semantics"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/sluice/bin:$PATH
# /etc/sluice is the (read-only) config mount; a relative store.path (the SQLite default) lives in
# the data directory, writable by the sluice user (mount a volume there to keep quotas)
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin sluice \
 && mkdir -p /var/lib/sluice && chown 10001:10001 /var/lib/sluice
ENV SLUICE_DATA_DIR=/var/lib/sluice
COPY --from=build /opt/sluice /opt/sluice
USER 10001:10001
WORKDIR /var/lib/sluice
# bootstrap listener, the first per-broker listeners, and the metrics port
EXPOSE 9092 9093 9094 9095 9404
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:9404/healthz', timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluice"]
CMD ["proxy", "--config", "/etc/sluice/sluice.yaml"]
