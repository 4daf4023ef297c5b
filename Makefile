# Runsite — `make run` (demo on SQLite) and `make test` (the whole suite).
# The Makefile finds a Python >= 3.12 by itself; override with `make PYTHON=/path/to/python3.12 ...`.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

# Candidates in order: $PYTHON, python3.13/3.12/python3 on PATH, then any pyenv 3.12+/3.13+.
define FIND_PYTHON
ok() { "$$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; }; \
if [ -n "$(PYTHON)" ]; then \
  if ok "$(PYTHON)"; then echo "$(PYTHON)"; exit 0; fi; \
  echo "PYTHON=$(PYTHON) is not a Python >= 3.12" >&2; exit 1; \
fi; \
for c in python3.14 python3.13 python3.12 python3 python; do \
  p=$$(command -v $$c 2>/dev/null) && ok "$$p" && { echo "$$p"; exit 0; }; \
done; \
if command -v pyenv >/dev/null 2>&1; then \
  root=$$(pyenv root); \
  for v in $$(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])(\.|$$)' | sort -rV); do \
    p="$$root/versions/$$v/bin/python3"; ok "$$p" && { echo "$$p"; exit 0; }; \
  done; \
fi; \
echo "No Python >= 3.12 found (Django 6 needs it). Install one, or run: make PYTHON=/path/to/python3.12 $(MAKECMDGOALS)" >&2; exit 1
endef

.PHONY: run test test-fast lint format fuzz reliability clean help agent-inbox-check

help:
	@echo "make run    demo on SQLite with a built-in worker, http://$(HOST):$(PORT)"
	@echo "make test   install and run the whole suite (PostgreSQL when DATABASE_URL points at it)"
	@echo "make lint   ruff + migrations check"

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@set -e; if [ ! -x "$(PY)" ]; then \
	  base=$$($(FIND_PYTHON)); echo "Creating $(VENV) with $$base"; "$$base" -m venv $(VENV); fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@

run: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	RUNS_GRAPHS=$${RUNS_GRAPHS:-runs/graphs/demo.json} $(PY) manage.py seed_demo
	@echo ""
	@echo "  Runsite is up at http://$(HOST):$(PORT)/   (API docs: http://$(HOST):$(PORT)/api/docs)"
	@echo "  Logins: admin/admin (staff), reviewer/reviewer (Reviewers), support/support (Support),"
	@echo "          acme-support/acme-support (Reviewers + Support, sees only resource acme)"
	@echo "  !! RUNS_API_AUTH=off: the JSON API accepts requests without an API key (demo only) !!"
	@echo ""
	@echo "  The Agent Inbox app on http://localhost:3000 may call the API (RUNS_CORS_ALLOWED_ORIGINS)"
	RUNS_EMBEDDED_WORKER=1 RUNS_API_AUTH=off DEBUG=$${DEBUG:-1} RUNS_WEBHOOK_ALLOW_PRIVATE=$${RUNS_WEBHOOK_ALLOW_PRIVATE:-1} \
	  RUNS_GRAPHS=$${RUNS_GRAPHS:-runs/graphs/demo.json} \
	  RUNS_CORS_ALLOWED_ORIGINS=$${RUNS_CORS_ALLOWED_ORIGINS:-http://localhost:3000,http://127.0.0.1:3000} \
	  $(PY) -m daphne -b $(HOST) -p $(PORT) runsite.asgi:application

test: $(VENV)/.installed
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not e2e and not slow" -x $(PYTEST_ARGS)

# Schemathesis with a larger example budget than CI's (several minutes).
fuzz: $(VENV)/.installed
	SCHEMATHESIS_EXAMPLES=$${SCHEMATHESIS_EXAMPLES:-200} $(PY) -m pytest tests/test_api_schema.py -q -p no:randomly

# Regenerate docs/reliability.md from the fault-injection and hostile-input tests
# (needs DATABASE_URL=postgres://… and REDIS_URL=redis://…).
reliability: $(VENV)/.installed
	RUNS_RELIABILITY_REPORT=docs/reliability.md $(PY) -m pytest tests/e2e/test_cluster.py tests/test_hostile.py tests/test_live_security.py -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) staticfiles db.sqlite3* test-artifacts

# The real Agent Inbox app (langchain-ai/agent-inbox) built from AGENT_INBOX_SRC (a checkout, a git
# directory or a git URL; only npm packages are downloaded) and driven in Playwright against a
# fresh Runsite: tools/agent_inbox/check.sh, docs/api.md "Agent Inbox check". The build is kept in
# AGENT_INBOX_WORKDIR (default /tmp/agent-inbox-check) and reused while the source is the same.
agent-inbox-check: $(VENV)/.installed
	tools/agent_inbox/check.sh $(AGENT_INBOX_SRC)
