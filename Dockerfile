# syntax=docker/dockerfile:1
# One image for `unthrottle operator` (the chart's Deployment) and `unthrottle agent` (its
# DaemonSet, which runs it as root: see charts/unthrottle/values.yaml, agent.securityContext).
#
#   docker build -t unthrottle:0.1.0 .
#
# Stage 1 builds the project's wheel and every dependency's; stage 2 holds only a virtualenv
# with them installed: no compiler, no pip cache, no source tree. tests/unit/test_dockerfile.py
# lints this file with hadolint and checks it against pyproject.toml (the package, its
# extras, the files its build needs, the Python version, the entry point and the version).

# The tests run on Python 3.11 on Debian 12 (bookworm): the image runs the same.
ARG PYTHON_VERSION=3.11.14
# Empty, or "@sha256:<digest>" of python:${PYTHON_VERSION}-slim-bookworm for your platforms
# (docker buildx imagetools inspect prints it): pins the base image exactly.
ARG PYTHON_DIGEST=
# The base of both stages: the official image. Only a machine that cannot pull it passes
# another: the laboratory's stand-in made from Debian's packages, with Debian's Python 3.11
# (lab/src/unthrottle_lab/kube/image.py, `make image`).
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm${PYTHON_DIGEST}

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# What the build backend needs, as pyproject.toml says: the project table, its readme, and
# the source root of [tool.setuptools.packages.find] (.dockerignore keeps the rest out).
COPY pyproject.toml README.md ./
COPY src ./src
# The runtime dependencies only, resolved from pyproject.toml: the `test` extra is for CI.
RUN pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/unthrottle \
 && /opt/unthrottle/bin/pip install --no-index --find-links /wheels /wheels/unthrottle-*.whl

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="unthrottle" \
      org.opencontainers.image.description="Find CFS throttling in Kubernetes, prove it, and fix it with the smallest CPU limit (or burst) that stops it." \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
# A user of its own, with a numeric id, so that the kubelet can check runAsNonRoot.
RUN groupadd --system --gid 10001 unthrottle \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin unthrottle
COPY --from=build /opt/unthrottle /opt/unthrottle
# MPLCONFIGDIR: matplotlib (the HTML report's plots) wants a writable cache; the chart mounts
# an emptyDir at /tmp, since the root filesystem is read-only. The bytecode was compiled at
# install time, so nothing needs writing at start.
ENV PATH=/opt/unthrottle/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
ENTRYPOINT ["unthrottle"]
CMD ["--help"]
