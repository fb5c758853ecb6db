# `make demo` and `make test` work on a machine that has only python3.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The CPU wheel of this version lies on disk here; any other torch requirement
# makes pip fetch a multi-GB CUDA build, so it is installed first when missing.
TORCH  := torch==2.13.0

.PHONY: setup demo test golden fuzz lint audit bench samples app clean

setup: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# constraints.txt pins every package to versions known to work together.
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# analyze exits 1 when it finds a failure: that is the demo's point, not an error.
demo: setup
	$(BIN)/forensics analyze sample_runs/ || [ $$? -eq 1 ]

# pytest exits 5 when it collects nothing; report that plainly instead of failing.
test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# Rewrite the golden reports (tests/golden/) and the report's JSON Schema after a
# deliberate change; review the diff.
golden: setup
	$(BIN)/python -m analyzer.model.schema > docs/report.schema.json
	FORENSICS_GOLDEN=update $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_golden.py

# The fuzz targets with a long budget (FORENSICS_FUZZ_EXAMPLES per target, default 20,000).
fuzz: setup
	FORENSICS_FUZZ=long $(BIN)/python -m pytest -q -p no:cacheprovider -m fuzz tests/fuzz

# The dashboard on the sample runs, served on 127.0.0.1 only.
app: setup
	$(BIN)/forensics app sample_runs/

# The pinned dependencies against known vulnerabilities (needs the network; says so without).
audit: setup
	$(BIN)/python .ci/audit.py

lint: setup
	$(BIN)/ruff check analyzer app tests bench
	$(BIN)/mypy analyzer

# Each benchmark prints its own figures and ratios; see docs/performance.md.
bench: setup
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/logs.py --profile all --repeat 2
	$(BIN)/python bench/align.py
	$(BIN)/python bench/checkpoints.py
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/capture.py
	$(BIN)/python bench/capture_frameworks.py

# Score the analysis on dead runs without captures, per half (docs/evaluation.md).
.PHONY: evaluate
evaluate: setup
	$(BIN)/python bench/evaluate.py --frameworks --out docs/evaluation.json
	$(BIN)/python -m analyzer.rules.docs sample_runs --evaluation docs/evaluation.json > docs/rules.md

# Regenerate the sample runs (real training, seeded, CPU) and the rules page scored on them.
samples: setup
	$(BIN)/python -m analyzer.scenarios sample_runs
	$(BIN)/python -m analyzer.rules.docs sample_runs --evaluation docs/evaluation.json > docs/rules.md

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
