# Every target sets up what it needs: a fresh machine needs only `make demo`
# and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test check bench clean venv prometheus browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## The local demo: the seed scenarios on this kernel (root), the model's prediction, then
## `unthrottle recommend` on a day of a small shop's history in a real Prometheus.
demo: $(STAMP) prometheus browser
	@if [ "$$(id -u)" = 0 ]; then $(BIN)/unthrottle lab run scenarios/seed-*.yaml; \
	else echo "lab run needs root (it creates cgroups); showing the model only"; fi
	$(BIN)/unthrottle simulate scenarios/seed-*.yaml
	$(BIN)/python demo/recommend_demo.py

## The real Prometheus server the tests and the demo use (Debian's package; root installs it).
prometheus:
	@command -v prometheus >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "prometheus is not installed and this is not root: its tests will be skipped"; fi; }

## The headless browser the HTML report's tests open it in: Debian's chromium (root installs
## it), driven by Playwright pointed at /usr/bin/chromium; nothing downloads a browser.
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else echo "chromium is not installed and this is not root: the browser tests will be skipped"; fi; }

## Lint, types, architecture contracts, then the whole test suite.
test: $(STAMP) prometheus browser check
	$(BIN)/pytest

check: $(STAMP)
	$(BIN)/ruff check operator tests bench demo
	$(BIN)/ruff format --check operator tests bench demo
	$(BIN)/mypy operator/unthrottle
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/simulate_speed.py
	$(BIN)/python bench/lab_vs_model.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
