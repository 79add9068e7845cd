# Two commands do everything on a fresh machine:  `make demo`  and  `make test`.
# Each creates .venv on first use (scripts/setup.sh says what it installs and how torch is chosen):
# `make demo` installs torch and seqmem with the plot extra (matplotlib); `make test` adds the dev and hf extras.
.PHONY: setup setup-demo demo demo-full compare headlines test lint
# Long jobs (above ~30 CPU-minutes) print their estimate and start only with YES=1 (`seqmem ... --yes`).
YESFLAG = $(if $(filter 1 yes true,$(YES)),--yes)
setup:
	bash scripts/setup.sh test
setup-demo:
	bash scripts/setup.sh demo
# The quick tour: each mechanism's main mixer and the variants that work (seconds: it reuses the committed runs;
# `seqmem demo --fresh` retrains them, about 8 min on 2 idle cores).
demo: setup-demo
	.venv/bin/seqmem demo --out runs/demo
# The full tour: every registered mixer (~26 CPU-minutes; reuses the quick tour's runs).
demo-full: setup-demo
	.venv/bin/seqmem demo --all --out runs/demo $(YESFLAG)
# The README's main result: the resumable MQAR comparison (hours on 2 cores; re-run to continue where it stopped).
compare: setup-demo
	OMP_NUM_THREADS=1 .venv/bin/seqmem sweep compare --out docs/results/compare/runs --report-dir docs/results/compare --jobs 2 $(YESFLAG)
# The paper headline campaigns (calibrations first; resumable, tens of CPU-hours in all): scripts/headlines.sh.
headlines: setup-demo
	YES=$(if $(YESFLAG),1) bash scripts/headlines.sh all
# the default suite in one worker process per core (pytest-xdist; TEST_JOBS=1 for one process)
TEST_JOBS ?= auto
test: setup
	.venv/bin/python -m pytest -n $(TEST_JOBS)
lint: setup
	.venv/bin/ruff check src tests
