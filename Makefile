# Two commands do everything on a fresh machine:  `make demo`  and  `make test`.
.PHONY: setup demo test lint
setup:
	bash scripts/setup.sh
demo: setup
	.venv/bin/seqmem demo --out runs/demo
test: setup
	.venv/bin/python -m pytest
lint: setup
	.venv/bin/ruff check src tests
