# syntax=docker/dockerfile:1
# Sluice, the Kafka throttling proxy. The analytics extra (PySpark) is not in this image: the
# Spark jobs run with spark-submit on a Spark cluster.
# Any image with Python 3.11 as `python` (and its venv module) works; the default is the official
# one. The image test builds FROM a debootstrapped Debian bookworm instead (scripts/image-base).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# a C compiler for the compiled data plane (protocol/_speedups.pyx, protocol/_log_speedups.pyx and
# quotas/_speedups.pyx, built by setup.py), and the Python headers when the base lacks them (a
# Debian python3 base; the official image has its own);
# only in this stage: the final image gets the built extension, not the compiler
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && if [ ! -f "$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*
# The layers go from what changes least to what changes most, so a rebuild after a change to the
# Python sources reuses the dependencies and the compiled extensions (with `--layers`).
# 1. From pyproject.toml alone: the build tools in a venv of their own (they build the wheel and never
# reach the image) and Sluice's runtime dependencies in /opt/sluice.
WORKDIR /src
COPY pyproject.toml ./
RUN python -m venv /opt/build && python -m venv /opt/sluice \
 && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(p['build-system']['requires']), file=open('/tmp/build.txt', 'w')); \
print('\n'.join(p['project']['dependencies']), file=open('/tmp/runtime.txt', 'w'))" \
 && /opt/build/bin/pip install -r /tmp/build.txt \
 && /opt/sluice/bin/pip install --no-compile -r /tmp/runtime.txt
# 2. From setup.py and the Cython sources alone: the compiled extensions, built once by setup.py's
# own list into /opt/extensions (the layout SLUICE_PREBUILT_EXTENSIONS reads). setup.py reads the
# project's metadata, whose readme is README.md: an empty stand-in here, the real one comes in step 3.
COPY setup.py ./
COPY protocol/*.pyx protocol/*.pxd protocol/
COPY quotas/*.pyx quotas/
COPY proxy/pumps/*.pyx proxy/pumps/
COPY proxy/stages/*.pyx proxy/stages/
COPY proxy/ops/*.pyx proxy/ops/
RUN touch README.md && /opt/build/bin/python setup.py -q build_ext --build-lib /opt/extensions \
 && rm -rf build README.md
# 3. The sources: a wheel with those extensions copied in, installed without its dependencies
# (step 1 installed them)
COPY README.md ./
COPY proxy/ proxy/
COPY protocol/ protocol/
COPY quotas/ quotas/
COPY spark_analytics/ spark_analytics/
COPY contracts/ contracts/
RUN SLUICE_PREBUILT_EXTENSIONS=/opt/extensions /opt/build/bin/pip wheel --no-build-isolation --no-deps \
      --wheel-dir /tmp/wheel . \
 && /opt/sluice/bin/pip install --no-compile --no-deps /tmp/wheel/*.whl

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Kafka-protocol throttling proxy with Kafka's quota semantics"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/sluice/bin:$PATH
# /etc/sluice is the (read-only) config mount; a relative store.path (the SQLite default) lives in
# the data directory, writable by the sluice user (mount a volume there to keep quotas)
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin sluice \
 && mkdir -p /var/lib/sluice /run/sluice && chown 10001:10001 /var/lib/sluice /run/sluice
# Sluice's environment variables override the config file: the metrics endpoint listens on every
# address of the container at 9404 (the HEALTHCHECK and the samples' probes use it); change the port
# with SLUICE_METRICS__PORT, the HEALTHCHECK follows it. /run/sluice is the supervisor's runtime_dir
# (workers > 1) when the config names it; on a read-only root mount a writable volume there.
ENV SLUICE_DATA_DIR=/var/lib/sluice SLUICE_METRICS__HOST=0.0.0.0 SLUICE_METRICS__PORT=9404
COPY --from=build /opt/sluice /opt/sluice
USER 10001:10001
WORKDIR /var/lib/sluice
# bootstrap listener, the first per-broker listeners, and the metrics port
EXPOSE 9092 9093 9094 9095 9404
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:%s/healthz' % os.environ['SLUICE_METRICS__PORT'], timeout=2).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["sluice"]
CMD ["proxy", "--config", "/etc/sluice/sluice.yaml"]
