#!/usr/bin/env bash
# Make `bookfs` visible to mount(8), so `mount -t fuse.bookfs` and fstab lines work.
#
# mount(8) runs /sbin/mount.fuse3, which runs `bookfs SOURCE MOUNTPOINT -o OPTS` through
# /bin/sh with PATH cleared, so only sh's default path is searched
# (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin).  This links the
# virtualenv's `bookfs` script (its shebang names the venv's python) into one of those.
# Usage: sudo bash mount_scripts/install-mount-helper.sh [TARGET_DIR]   (default /usr/local/bin)
# Idempotent; refuses to replace a `bookfs` there that is not a symlink.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BOOKFS_VENV:-$here/.venv}"
target_dir="${1:-/usr/local/bin}"
script="$venv/bin/bookfs"
link="$target_dir/bookfs"

if [ ! -x "$script" ]; then
    echo "install-mount-helper: $script not found; run mount_scripts/setup.sh first" >&2
    exit 1
fi
if [ -e "$link" ] && [ ! -L "$link" ]; then
    echo "install-mount-helper: $link exists and is not a symlink; left as is" >&2
    exit 1
fi
ln -sfn "$script" "$link"
echo "install-mount-helper: $link -> $script"
env -i /bin/sh -c 'command -v bookfs' >/dev/null ||
    echo "install-mount-helper: warning: $target_dir is not on /bin/sh's default PATH" >&2
