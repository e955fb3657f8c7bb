#!/usr/bin/env bash
# Run the whole test suite: installs what it needs (Debian packages, a virtualenv, the pip
# packages), then runs pytest over tests/.  Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$here/mount_scripts/setup.sh")"
cd "$here"
exec "$venv/bin/python" -m pytest "$@"
