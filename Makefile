# The two commands of the README contract: `make demo` and `make test`.
# Both bootstrap everything they need on a fresh machine.
#   make demo PORT=9443 ONESHOT=1   # another port; run the scripted session and exit
#   make demo IDP=1                 # also Keycloak: the admin console, its URL and demo users
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
OPA     := .tools/bin/opa
STAMP   := $(VENV)/.installed

.PHONY: all demo demo-tools test bench lint typecheck pytest policy-check policy-ci tools venv clean bundle compose-config console-screenshots

all: test

$(STAMP): pyproject.toml
	@echo ">> creating virtualenv and installing pvegate (dev extras)"
	@test -d $(VENV) || $(PY) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

tools:
	@bash scripts/provision-tools.sh
	@bash scripts/provision-inspector.sh
	@bash scripts/provision-compose.sh
	@bash scripts/provision-postgres.sh
	@bash scripts/provision-keycloak.sh
	@bash scripts/provision-chromium.sh

# what the demo runs on: OPA, the Inspector its README line uses, Keycloak with IDP=1;
# not the test-only PostgreSQL, Chromium and docker-compose of `make tools`
demo-tools:
	@bash scripts/provision-tools.sh
	@bash scripts/provision-inspector.sh
	@$(if $(IDP),bash scripts/provision-keycloak.sh,true)

demo: venv demo-tools
	@$(BIN)/pvegate demo $(if $(ONESHOT),--oneshot,) $(if $(PORT),--port $(PORT),) $(if $(IDP),--idp,)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

policy-check: tools
	@bash scripts/policy-checks.sh

# what a policy repository's CI runs: the checks, then a replay gate (AUDIT_EXPORT=file to use real decisions)
policy-ci: venv tools
	@bash scripts/policy-ci.sh

pytest: venv tools
	$(BIN)/pytest -q

test: lint typecheck policy-check pytest

bench: venv tools
	@bash scripts/bench.sh

# the signed bundle docker/compose.yaml serves (demo signing keys made when missing): bundles/README.md
bundle: venv tools
	@bash scripts/bundle.sh

# docker/config/ from docker/config.example/, with fresh OPA and admin tokens; never overwrites
compose-config:
	@bash scripts/compose-config.sh

# docs/console/*.png, the console's screenshots in docs/console.md: taken by its browser test
# (Chromium + Keycloak, tests/console/test_browser.py), which otherwise writes them to a temp dir
console-screenshots: venv tools
	PVEGATE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(BIN)/pytest -q tests/console/test_browser.py

clean:
	rm -rf $(VENV) .state build *.egg-info
