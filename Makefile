# Entry points; scripts/ holds the logic so each target also works as a plain `bash scripts/...`.
.PHONY: test lint format demo dev docs

# Pass pytest arguments with ARGS, e.g. `make test ARGS="tests/resources -q"`.
ARGS ?=

test:
	bash scripts/test.sh $(ARGS)

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format:
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

demo:
	bash scripts/demo.sh

dev:
	bash scripts/dev.sh

docs:
	bash scripts/docs.sh $(ARGS)
