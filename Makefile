# The two commands of the README: `make run` and `make test`. Everything else is a helper.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: setup run test test-slow lint fmt bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

## run: the main job on the embedded default (bundled broker + simulator + daemon)
run: $(STAMP)
	$(BIN)/flopwatch up

## test: lint, type-check, then the suite (real broker and Alertmanager included) except
## the `slow` tests, which `make test-slow` and CI (.ci/run) run: about 9 minutes of killing
## and pausing the daemon, broker and Alertmanager, the daemon as a process with the fleet
## stage, the scenario pack at 128 devices and the heaviest property tests (ids across
## batch sizes, pipeline invariants, bytes fuzzing), that would take `make test` past ten
## minutes on a 2-core machine. The suite runs on TEST_WORKERS pytest-xdist workers, each
## with its own brokers (a fixed count: a container's CPU count can be the host's).
TEST_WORKERS ?= 2
test: $(STAMP) lint
	$(BIN)/pytest -m "not slow" -n $(TEST_WORKERS)

test-slow: $(STAMP)
	$(BIN)/pytest -m slow

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy monitor sim bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/vulture

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## bench: every benchmark, JSON under out/bench/
bench: $(STAMP)
	mkdir -p out/bench
	$(BIN)/python -m bench.decode --json out/bench/decode.json
	$(BIN)/python -m bench.stages --json out/bench/stages.json
	$(BIN)/python -m bench.simulator --json out/bench/sim.json
	$(BIN)/python -m bench.detect --json out/bench/detect.json
	$(BIN)/python -m bench.scores --json out/bench/scores.json
	$(BIN)/python -m bench.diagnose --json out/bench/diagnose.json
	$(BIN)/python -m bench.checkpoint --json out/bench/checkpoint.json
	$(BIN)/python -m bench.changes --json out/bench/changes.json
	$(BIN)/python -m bench.ingest --json out/bench/ingest.json
	$(BIN)/python -m bench.memory --json out/bench/memory.json
	$(BIN)/python -m bench.daemon --json out/bench/daemon.json
	$(BIN)/python -m bench.ceiling --json out/bench/ceiling.json
	@if [ -n "$(TCPD)" ]; then $(BIN)/python -m bench.tcpd --data "$(TCPD)" --json out/bench/tcpd.json; \
	else echo "bench/tcpd.py skipped: set TCPD=<a checkout of alan-turing-institute/TCPD>"; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out
