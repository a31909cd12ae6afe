# Every target sets up what it needs: a fresh machine needs only `make demo`
# and `make test`.
# The first Python ≥ 3.11 on the PATH (Ubuntu 22.04's python3 is 3.10): say PYTHON=… to choose.
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	  command -v $$p >/dev/null && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  2>/dev/null && { echo $$p; break; }; done)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo demo-lab test unit check bench clean venv prometheus victoria-metrics browser controlplane image

$(STAMP): pyproject.toml lab/pyproject.toml
	@test -n "$(PYTHON)" || { echo "unthrottle needs Python >= 3.11: install python3.11 (or newer) and run make again, or say PYTHON=/path/to/python3.11"; exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      python3-venv >/dev/null; \
	  else echo "$(PYTHON) cannot make a virtualenv: run 'apt-get install python3-venv' as root, then make again"; exit 1; fi; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]' -e ./lab
	touch $(STAMP)

venv: $(STAMP)

## The local demo: the whole loop on this machine (root) — a real control plane and a real
## node (kubelet, containerd, runc), two throttled Deployments on it, the agent, a real
## Prometheus scraping it and the kubelet's cAdvisor, `unthrottle operator` (Recommend, then
## Apply InPlace: the kubelet resizes the running pods), before / after from the kernel's
## counters, the HTML report.
demo: $(STAMP) prometheus browser controlplane image
	$(BIN)/python demo/loop.py

## The earlier demos: the seed scenarios on this kernel and the model's prediction of them,
## then `unthrottle recommend` on a day of a small shop's history in a real Prometheus.
demo-lab: $(STAMP) prometheus
	@if [ "$$(id -u)" = 0 ]; then $(BIN)/unthrottle-lab run scenarios/seed-*.yaml; \
	else echo "lab run needs root (it creates cgroups); showing the model only"; fi
	$(BIN)/unthrottle-lab simulate scenarios/seed-*.yaml
	$(BIN)/python demo/recommend_demo.py

## The real Prometheus server the tests and the demo use (Debian's package; root installs it).
prometheus:
	@command -v prometheus >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	    if [ -d /run/systemd/system ]; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi; \
	  else echo "prometheus is not installed and this is not root: its tests will be skipped"; fi; }
	@# the package starts a system service where systemd runs: the tests start their own

## The PromQL-compatible store the backend tests also run against (tests/*/test_victoria*.py):
## Debian's single-node VictoriaMetrics; root installs it.
victoria-metrics:
	@command -v victoria-metrics >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends victoria-metrics >/dev/null; \
	    if [ -d /run/systemd/system ]; then \
	      systemctl disable --now victoria-metrics >/dev/null 2>&1 || true; fi; \
	  else echo "victoria-metrics is not installed and this is not root: its tests will be skipped"; fi; }
	@# the package enables and starts a system service where systemd is the init (even a
	@# "degraded" one): stopped and disabled above; the tests start their own on 127.0.0.1

## The headless browser the HTML report's tests open it in: Debian's chromium (root installs
## it), driven by Playwright pointed at /usr/bin/chromium; nothing downloads a browser.
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else echo "chromium is not installed and this is not root: the browser tests will be skipped"; fi; }

## The real Kubernetes control plane the tests and the demo start: kube-apiserver,
## kube-controller-manager, kube-scheduler, kubectl and the kubelet from k8s.io/kubernetes,
## etcd and kwok, built with Go from the module in controlplane/; and the real node's
## containerd, runc, CNI plugins and pause from controlplane/node/ (runc links libseccomp:
## Debian's libseccomp-dev, which root installs, with iproute2 for the node's bridge). Both
## go to ~/.cache/unthrottle (outside the work tree; $$UNTHROTTLE_CACHE moves it), reused
## while go.mod, go.sum and Go are unchanged.
## Beside them, from their own Go modules: Prometheus 3 with Kubernetes discovery and Thanos
## (sidecar and querier: tests/cluster/test_thanos.py), reused while their pinned version
## and Go are unchanged.
controlplane: $(STAMP)
	@{ pkg-config --exists libseccomp 2>/dev/null && command -v ip >/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends libseccomp-dev pkg-config iproute2 >/dev/null; \
	  else echo "the real node's runc needs libseccomp-dev and pkg-config: install them as root"; fi; }
	@command -v iptables-restore >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends iptables >/dev/null; \
	  else echo "the real node's kube-proxy needs iptables: install it as root"; fi; }
	$(BIN)/python -m unthrottle_lab.kube build >/dev/null

## The image the chart's pods run, built from the Dockerfile as it is by Debian's buildah, on
## a stand-in for the official python base made by mmdebstrap (no base image can be pulled
## here; the Dockerfile's BASE_IMAGE build arg is the only difference). Cached in
## ~/.cache/unthrottle/images, keyed on what the build reads.
image: $(STAMP) controlplane
	@{ command -v buildah >/dev/null && command -v mmdebstrap >/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends buildah mmdebstrap >/dev/null; \
	  else echo "the image needs buildah and mmdebstrap: install them as root"; fi; }
	$(BIN)/python -m unthrottle_lab.kube image

## Lint, types, architecture contracts, then the whole test suite (its 30 slowest tests
## listed at the end: where the suite's time goes).
test: $(STAMP) prometheus victoria-metrics browser controlplane image check
	$(BIN)/pytest --durations=30

## The unit tests alone: no root, no Go, no server (tests/unit), in well under two minutes.
unit: $(STAMP)
	$(BIN)/pytest tests/unit

check: $(STAMP)
	$(BIN)/ruff check src lab tests bench demo
	$(BIN)/ruff format --check src lab tests bench demo
	$(BIN)/mypy src/unthrottle lab/src/unthrottle_lab
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/simulate_speed.py
	@if [ "$$(id -u)" = 0 ]; then $(BIN)/python bench/lab_vs_model.py --repeats 2 --isolate; \
	else echo "bench/lab_vs_model.py runs the lab, which creates cgroups: run make bench as root"; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
