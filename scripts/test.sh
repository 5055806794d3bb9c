#!/usr/bin/env bash
# Run the lint gates and the test suite. Exit non-zero on any failure, including "no tests ran".
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
ruff check fsage tests bench || status=1
ruff format --check fsage tests bench || status=1
mypy || status=1
python3 -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests" >&2
  rc=1
fi
[ "$rc" -ne 0 ] && status=$rc
exit $status
