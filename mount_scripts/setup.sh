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
command -v patch >/dev/null 2>&1 || need_pkgs+=(patch)
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)  # the report's browser test
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
need_install=0
if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ] ||
        [ "$here/bookfs/fs/append/_fdscan.c" -nt "$stamp" ] ||
        [ "$here/bookfs/noun/_core.pyx" -nt "$stamp" ] ||
        [ "$here/bookfs/spark/_rows.pyx" -nt "$stamp" ] ||
        [ "$here/bookfs/formats/_framing.pyx" -nt "$stamp" ]; then
    need_install=1
fi
# pyfuse3 built from its pinned PyPI sdist with bookfs's patch (reads by inode, noflush and
# cache_readdir per open, queued requests taken without a readiness wait: see the patch's
# header).  Without it bookfs still works, on the path that costs more FUSE requests, and
# its info file says so.
patch_file="$here/mount_scripts/pyfuse3-3.5.0-bookfs.patch"
patch_stamp="$venv/.pyfuse3-patched-$(sha256sum "$patch_file" | cut -c1-16)"
need_pyfuse3=0
if [ ! -f "$patch_stamp" ] || ! "$venv/bin/python" -c \
        "import pyfuse3, sys; sys.exit('busy_poll' not in getattr(pyfuse3, 'FEATURES', ()))" \
        2>/dev/null; then
    need_pyfuse3=1
fi
[ "$need_install" = 1 ] && { "$venv/bin/python" -m pip install -q --upgrade pip \
    >"$venv/pip-upgrade.log" 2>&1 || { cat "$venv/pip-upgrade.log" >&2; exit 1; }; }

# The patched pyfuse3 compiles (a minute of gcc on one core) while pip installs the rest.
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
build_log="$venv/pyfuse3-build.log"
if [ "$need_pyfuse3" = 1 ]; then
    echo "setup: building pyfuse3 3.5.0 with $(basename "$patch_file")" >&2
    {
        "$venv/bin/python" -m pip download --no-deps --no-binary :all: pyfuse3==3.5.0 \
            -d "$build" &&
        echo "88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24  $build/pyfuse3-3.5.0.tar.gz" |
            sha256sum -c - &&
        tar xzf "$build/pyfuse3-3.5.0.tar.gz" -C "$build" &&
        (cd "$build/pyfuse3-3.5.0" && patch -p1 <"$patch_file" && rm -f src/pyfuse3/__init__.c) &&
        "$venv/bin/python" -m pip wheel --no-deps -w "$build/wheel" "$build/pyfuse3-3.5.0"
    } >"$build_log" 2>&1 &
    build_pid=$!
fi

if [ "$need_install" = 1 ]; then
    echo "setup: installing bookfs and its dependencies into $venv" >&2
    pip_log="$venv/pip-install.log"
    if [ "$need_pyfuse3" = 1 ]; then
        # every dependency but pyfuse3, whose patched wheel is being built
        mapfile -t deps < <("$venv/bin/python" - "$here/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for dep in project["dependencies"] + project["optional-dependencies"]["test"]:
    if not dep.replace(" ", "").startswith("pyfuse3"):
        print(dep)
PY
)
        ok() { "$venv/bin/python" -m pip install "${deps[@]}" &&
               "$venv/bin/python" -m pip install --no-deps -e "$here"; }
    else
        ok() { "$venv/bin/python" -m pip install -e "$here[test]"; }
    fi
    if ! ok >"$pip_log" 2>&1; then
        tail -30 "$pip_log" >&2
        echo "setup: pip install failed; full log in $pip_log" >&2
        [ -n "${build_pid:-}" ] && kill "$build_pid" 2>/dev/null
        exit 1
    fi
fi

if [ "$need_pyfuse3" = 1 ]; then
    if ! { wait "$build_pid" &&
           "$venv/bin/python" -m pip install --no-deps --force-reinstall "$build"/wheel/pyfuse3-*.whl &&
           "$venv/bin/python" -c "import pyfuse3; assert 'busy_poll' in pyfuse3.FEATURES"
         } >>"$build_log" 2>&1; then
        tail -30 "$build_log" >&2
        echo "setup: building the patched pyfuse3 failed; full log in $build_log" >&2
        exit 1
    fi
    rm -f "$venv"/.pyfuse3-patched-*
    touch "$patch_stamp"
fi
[ "$need_install" = 1 ] && touch "$stamp"
# bookfs's own bytecode, as `pip install` of a wheel compiles a package's: the editable
# install compiles nothing, and where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) every `bookfs` command, daemon, card builder and Spark worker would compile
# bookfs from source at each start, about 85 ms (`import bookfs.cli.commands,
# bookfs.fs.daemon.mount`: 70 ms with the bytecode, 155 ms without).  compileall
# writes it even so, and skips what is up to date (a second run takes 0.1 s); a source
# edited afterwards makes its .pyc stale, which Python checks (the source's mtime and
# size are in the .pyc's header) and ignores.
"$venv/bin/python" -m compileall -q -j 0 "$here/bookfs" >/dev/null ||
    echo "setup: compiling bookfs's bytecode failed; it will be compiled at each start" >&2
echo "$venv"
