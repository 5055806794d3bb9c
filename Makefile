# Common tasks; the README's two commands are `make demo` and `make test`.
.PHONY: setup demo test lint check bench clean

setup:
	scripts/setup.sh

demo: setup
	fsage demo

test: setup
	scripts/test.sh

lint:
	ruff check fsage tests bench
	ruff format --check fsage tests bench
	mypy

check: lint test

bench: setup
	python3 bench/snapshot.py

clean:
	rm -rf build fsage/*.so fsage-demo
