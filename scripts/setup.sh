#!/usr/bin/env bash
# Install everything fsage needs on a fresh Debian 12 machine (as root), then build and install
# fsage itself with its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

# systemd: systemd-analyze verifies the daemon's units; Java 17: Spark (contrib/spark, its test);
# heaptrack: bench/fleet_memory.py --heaptrack
APT_PACKAGES=(
  e2fsprogs libext2fs-dev pkg-config gcc make python3-dev
  xfsprogs btrfs-progs util-linux postmark chromium blktrace
  fuse3 libfuse3-dev
  systemd openjdk-17-jre-headless heaptrack
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages (run as root to install): ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -e ".[test]"
# The editable install builds the extension in build/; put it next to the sources too so that
# running from the checkout (python -m fsage, pytest) finds it.
python3 setup.py -q build_ext --inplace >/dev/null
