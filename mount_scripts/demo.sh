#!/usr/bin/env bash
# The main job, end to end on the bundled sample log: build it, mount it, browse it with
# shell tools, append events through new/, show and report, run the Spark pipeline over the
# mount, unmount.
# Usage: bash mount_scripts/demo.sh [--events N] [--workdir DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
events=20000
work="${BOOKFS_DEMO_DIR:-$here/out/demo}"
while [ $# -gt 0 ]; do
    case "$1" in
        --events) events="$2"; shift 2 ;;
        --workdir) work="$2"; shift 2 ;;
        -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
        *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

venv="$(bash "$here/mount_scripts/setup.sh")"
export PATH="$venv/bin:$PATH"
export BOOKFS_CACHE_DIR="$work/cache"
log="$work/sample"
mnt="$work/mnt"
mkdir -p "$work" "$mnt"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cleanup() {
    mountpoint -q "$mnt" && bookfs umount "$mnt" >/dev/null 2>&1 || true
}
trap cleanup EXIT

if [ ! -f "$log/book.log" ]; then
    step "build the sample log ($events events)"
    bookfs sample "$log" --events "$events"
fi
bookfs info "$log"

step "mount it read-write"
bookfs mount "$log" "$mnt"

step "browse: ls, ls -l, stat, cat, xxd, du"
ls "$mnt"
ls -l "$mnt/events" | sed -n 1,5p
echo "... $(ls "$mnt/events" | wc -l) event files"
stat -c '%n: %s bytes, inode %i, mtime %y' "$mnt/events/000000000006"
cat "$mnt/info"
head -c 48 "$mnt/events/000000000006" | xxd
xxd "$mnt/meta/who"
du -sh "$mnt/events"

step "append through new/: cp, then bookfs append (which reports each result)"
next=$(sed -n 's/^next: *//p' "$mnt/info")
printf '\x00\x00\x00\x00\x02' > "$work/payload.bin"   # mug 0 ++ jam(0)
cp "$work/payload.bin" "$mnt/new/$next"
ls -l "$mnt/events/$(printf '%012d' "$next")"
xxd "$mnt/events/$next"
bookfs append "$mnt" "$work/payload.bin"
grep -E '^(last|next|events):' "$mnt/info"

step "read an event as a person: bookfs show, pretty/"
bookfs show "$mnt" 6
head -n 4 "$mnt/pretty/7"

step "a picture of the log: bookfs report"
bookfs report "$mnt" --out "$work/report"
ls "$work/report"

if bookfs spark --help >/dev/null 2>&1; then
    step "Spark pipeline over the same mount"
    # events/ and segments/ are the mount's read-only companion's: reads cost no FUSE
    # open (docs/architecture.md)
    grep '^reads:' "$mnt/info"
    rm -rf "$work/parquet"
    bookfs spark "$mnt" --out "$work/parquet"
    ls "$work/parquet"
fi

step "unmount"
bookfs umount "$mnt"
trap - EXIT
echo "demo finished: log in $log, outputs in $work"
