#!/usr/bin/env bash
# Idempotent environment set-up for bookfs: Debian packages, a virtualenv, pip packages.
# Usage: source-free; run `bash mount_scripts/setup.sh`. Prints the venv path on success.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BOOKFS_VENV:-$here/.venv}"

need_pkgs=()
command -v fusermount3 >/dev/null 2>&1 || need_pkgs+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_pkgs+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_pkgs+=(pkg-config)
command -v xxd >/dev/null 2>&1 || need_pkgs+=(xxd)
command -v rsync >/dev/null 2>&1 || need_pkgs+=(rsync)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    $sudo_cmd apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
if ! command -v java >/dev/null 2>&1; then
    echo "setup: installing a Java runtime for Spark" >&2
    sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    $sudo_cmd apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating virtualenv $venv" >&2
    python3 -m venv "$venv"
fi
stamp="$venv/.bookfs-installed"
if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
    echo "setup: installing bookfs and its dependencies into $venv" >&2
    pip_log="$venv/pip-install.log"
    if ! { "$venv/bin/python" -m pip install --upgrade pip &&
           "$venv/bin/python" -m pip install -e "$here[test]"; } >"$pip_log" 2>&1; then
        tail -30 "$pip_log" >&2
        echo "setup: pip install failed; full log in $pip_log" >&2
        exit 1
    fi
    touch "$stamp"
fi
echo "$venv"
