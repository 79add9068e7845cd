# Two commands do everything on a fresh machine:  `make demo`  and  `make test`.
# Each creates .venv on first use (scripts/setup.sh says what it installs and how torch is chosen):
# `make demo` installs torch and seqmem with the plot extra (matplotlib); `make test` adds the dev and hf extras.
.PHONY: setup setup-demo demo compare headlines test lint
setup:
	bash scripts/setup.sh test
setup-demo:
	bash scripts/setup.sh demo
demo: setup-demo
	.venv/bin/seqmem demo --out runs/demo
# The README's main result: the resumable MQAR comparison (hours on 2 cores; re-run to continue where it stopped).
compare: setup-demo
	OMP_NUM_THREADS=1 .venv/bin/seqmem sweep compare --out docs/results/compare/runs --report-dir docs/results/compare --jobs 2
# The paper headline campaigns (calibrations first; resumable, tens of CPU-hours in all): scripts/headlines.sh.
headlines: setup-demo
	bash scripts/headlines.sh all
test: setup
	.venv/bin/python -m pytest
lint: setup
	.venv/bin/ruff check src tests
