# Two commands do all the set-up: `sudo make experiment` and `make test` (both run `setup`).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
DEB_PACKAGES := mininet openvswitch-switch iperf3 iperf iputils-ping ethtool nftables openssh-client
# Only the tests need these: the live view's test renders the page in a headless browser.
TEST_DEB_PACKAGES := chromium
# Every server of a fabric across machines: Mininet's remote nodes run `sudo -E` at both ends of SSH.
SERVER_DEB_PACKAGES := sudo openssh-server
SPEC ?= experiments/default.yaml
OUT ?=
PYTEST_ARGS ?=

.PHONY: setup setup-server emulated-server emulated-server-stop deb test-deb deb-packages venv ovs test unit experiment bench bench-rest bench-fabric clean-net

setup: deb venv ovs

# Install only the Debian packages that are missing (idempotent; `apt-get update` only when needed).
deb:
	@$(MAKE) --no-print-directory deb-packages PACKAGES="$(DEB_PACKAGES)"

# A server of a fabric across machines (docs/cluster.md): what `setup` installs, plus sudo and an
# SSH server, started if none runs (images without an init system start none).
setup-server: setup
	@$(MAKE) --no-print-directory deb-packages PACKAGES="$(SERVER_DEB_PACKAGES)"
	@pgrep -x sshd >/dev/null || { mkdir -p /run/sshd && /usr/sbin/sshd && echo "setup-server: sshd started"; }

# A second server on this machine (emulation/emulated_server.py, docs/cluster.md): a network namespace
# with its own sshd and Open vSwitch behind an underlay veth. Prints its address for cluster.servers.
SERVER_NAME ?= srv2
emulated-server: setup
	@$(MAKE) --no-print-directory deb-packages PACKAGES="$(SERVER_DEB_PACKAGES)"
	@$(PY) -m emulation.emulated_server start --name $(SERVER_NAME)

emulated-server-stop: venv
	@$(PY) -m emulation.emulated_server stop --name $(SERVER_NAME)

# The two-server test starts an emulated server: sshd and sudo as on a real one.
test-deb:
	@$(MAKE) --no-print-directory deb-packages PACKAGES="$(TEST_DEB_PACKAGES) $(SERVER_DEB_PACKAGES)"

deb-packages:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "setup: missing Debian packages:$$missing; run as root (sudo make setup)" >&2; exit 1; fi; \
	  echo "setup: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The venv sees Debian's mininet module (system site packages); Ryu 4.34 needs old setuptools.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt
	@test -x $(PY) || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check 'setuptools<70' wheel
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -r requirements.txt
	@touch $@

# Raise the socket buffers the switches need (never lower them), then start Open vSwitch, or
# restart it once if it runs with a smaller transmit buffer (emulation/machine.py says why).
ovs: venv
	@if [ "$$(id -u)" != 0 ]; then \
	  if ovs-vsctl --timeout=3 show >/dev/null 2>&1; then exit 0; fi; \
	  echo "setup: Open vSwitch is not running; start it as root (sudo make setup)" >&2; exit 1; \
	fi; \
	$(PY) -m emulation.machine

# The lint step first (pyproject.toml: ruff), then every test: the unit tests on both cores
# (pytest-xdist), the integration tests one at a time, as each builds a fabric. A PYTEST_ARGS="-k ..."
# that selects nothing in one half (pytest's status 5) is not a failure.
test: setup test-deb
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 tests/unit $(PYTEST_ARGS) || [ $$? = 5 ]
	$(PY) -m pytest -q tests/integration $(PYTEST_ARGS) || [ $$? = 5 ]

# Unit tests only (tests/unit): no root, no network. Integration tests (tests/integration) build fabrics.
unit: venv
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 tests/unit $(PYTEST_ARGS)

experiment: setup
	$(PY) -m experiments run $(SPEC) $(if $(OUT),--out $(OUT))

bench: venv
	$(PY) -m hostapps.bench

bench-rest: venv
	$(PY) -m controller.bench

bench-fabric: setup
	$(PY) -m emulation.bench

clean-net:
	$(PY) -m emulation.cleanup $(if $(HAND_RUN),--hand-run)
