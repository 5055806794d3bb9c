#!/usr/bin/env bash
# Run the lint gates and the test suite. Exit non-zero on any failure, including "no tests ran".
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
ruff check fsage tests bench || status=1
ruff format --check fsage tests bench || status=1
mypy || status=1
# The suite makes real file-system images under the temporary directory; say up front when
# the disk is too full for them, since a full disk fails every later test at once.
tmp="${TMPDIR:-/tmp}"
free_mib=$(df -Pm "$tmp" | awk 'NR==2 {print $4}')
if [ -n "$free_mib" ] && [ "$free_mib" -lt 4096 ]; then
  echo "test: only ${free_mib} MiB free under $tmp; the suite needs about 4 GiB for its images" >&2
fi
python3 -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests" >&2
  rc=1
fi
[ "$rc" -ne 0 ] && status=$rc
exit $status
