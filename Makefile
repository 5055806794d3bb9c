# Common tasks; the README's two commands are `make demo` and `make test`.
.PHONY: setup demo test lint check bench clean install-units

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

# The daemon's systemd units, naming this fsage and the configuration (as root):
#   make install-units CONFIG=/etc/fsage/fsage.toml
CONFIG ?= /etc/fsage/fsage.toml
UNIT_DIR ?= /etc/systemd/system
install-units:
	fsage daemon --config $(CONFIG) --install-units $(UNIT_DIR)
	systemctl daemon-reload

clean:
	rm -rf build fsage/*.so fsage-demo
