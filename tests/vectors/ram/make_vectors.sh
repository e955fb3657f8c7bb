#!/usr/bin/env bash
# make_vectors.sh: golden vectors of vere's "ram" event encoding, made by vere's own code.
#
#   tests/vectors/ram/make_vectors.sh [OUT.json]      (default: vectors.json beside it)
#
# Builds driver.c (this directory) against urbit/vere commit
#   125ac225d09d94e7d2c1d7bee9e0369e6013dfb3  ("noun: adds ram/tap reference-aware
#   serialization", branch ml/bob, PR #985)
# outside vere's build (no zig): the commit's pkg/noun/serial.c (u3s_ram_xeno, u3s_tap_xeno,
# u3s_jam_xeno) with the parts of pkg/noun, pkg/ur, pkg/c3 and ext/murmur3 it needs, and
# runs it.  The ram code of serial.c is unchanged from 125ac225 to ml/bob's head (df4f2b77);
# u3_disk_etch (pkg/vere/disk.c) writes events with it from 41d3bb2b on that branch.
#
# Takes about 6 s (measured: 5.8 s wall, 3.8 s CPU, nearly all of it compiling; the driver
# runs ~1 s, forking one child per mutated input).  Needs: git, a clone of urbit/vere
# holding the commit ($VERE_GIT; a bare git dir is fine), and the Debian packages
#   clang-14 libgmp-dev libssl-dev libsigsegv-dev libunwind-dev
# (apt-get install -y --no-install-recommends clang-14 libgmp-dev libssl-dev \
#      libsigsegv-dev libunwind-dev).
#
# Why clang, not gcc: vere builds with zig cc (clang); pkg/noun/manage.c declares
# u3m_Ford_fresh_road_depth_h static after manage.h declares it extern, which clang
# accepts under -fms-extensions and gcc refuses.  "-include stdbool.h" stands in for
# C23's true/false keywords, which vere's -std=gnu23 has and clang 14's -std=gnu2x lacks.
#
# Compiled from vere, unmodified:
#   pkg/c3/defs.c  pkg/ur/bitstream.c  pkg/ur/hashcons.c  ext/murmur3/vendor/murmur3.c
#   pkg/noun/{allocate,events,hashtable,imprison,log,manage,options,retrieve,serial,trace}.c
# each with exactly (the -D flags are those build.zig gives every file on x86_64 linux):
#   clang-14 -std=gnu2x -O2 -fms-extensions -fno-omit-frame-pointer -w -include stdbool.h
#     -DU3_GUARD_PAGE -DU3_OS_ENDIAN_little=1 -DU3_OS_PROF=1 -DU3_OS_linux=1
#     -DU3_CPU_x86_64=1 -I pkg -I pkg/noun -I pkg/noun/platform/linux -I pkg/c3
#     -I ext/murmur3/vendor -I stubinc -c FILE.c -o FILE.o
# and linked with driver.o and stubs.o:
#   clang-14 -o driver *.o -lgmp -lcrypto -lsigsegv -lunwind
#
# Not compiled, and stubbed instead (stubs.c; each stub aborts if it is ever reached,
# except u3je_secp_init, which u3m_init calls and which does nothing here):
#   pkg/noun/jets.c and pkg/noun/jets/*  (the jet system: u3j_*, u3q*/u3k* jets, secp)
#   pkg/noun/nock.c (u3n_*), pkg/noun/vortex.c (u3v_*, and the u3v_Home pointer, which
#   u3m_pave sets), pkg/noun/zave.c (u3z_reap)
#   libbacktrace and whereami (crash stack traces), whose headers are the three
#   stubinc/ files this script writes (backtrace.h, whereami.h, an empty urcrypt.h).
# The driver boots the loom as u3m_boot_lite does, minus u3j_boot (jets) and u3e_init
# (guard page): ram, jam, tap and mug only allocate, read and hash nouns.
set -euo pipefail

VERE_COMMIT=125ac225d09d94e7d2c1d7bee9e0369e6013dfb3
HERE=$(cd "$(dirname "$0")" && pwd)
VERE_GIT=${VERE_GIT:-/work/.mirror/urbit+vere/repo}
CC=${CC:-clang-14}
OUT=${1:-$HERE/vectors.json}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

git -C "$VERE_GIT" archive "$VERE_COMMIT" pkg/c3 pkg/ur pkg/noun ext/murmur3 | tar -x -C "$WORK"

mkdir -p "$WORK/stubinc"
cat > "$WORK/stubinc/backtrace.h" <<'EOF'
/* stub: the libbacktrace declarations pkg/noun/manage.c uses (crash stack traces) */
#include <stdint.h>
struct backtrace_state;
typedef void (*backtrace_error_callback)(void*, const char*, int);
typedef int (*backtrace_full_callback)(void*, uintptr_t, const char*, int, const char*);
struct backtrace_state* backtrace_create_state(const char*, int, backtrace_error_callback, void*);
int backtrace_full(struct backtrace_state*, int, backtrace_full_callback,
                   backtrace_error_callback, void*);
int backtrace_pcinfo(struct backtrace_state*, uintptr_t, backtrace_full_callback,
                     backtrace_error_callback, void*);
EOF
cat > "$WORK/stubinc/whereami.h" <<'EOF'
/* stub: the whereami declaration pkg/noun/manage.c uses (crash stack traces) */
int wai_getExecutablePath(char* out, int capacity, int* dirname_length);
EOF
echo '/* stub: pkg/noun/manage.c includes urcrypt.h and calls none of it */' \
  > "$WORK/stubinc/urcrypt.h"

CFLAGS=(-std=gnu2x -O2 -fms-extensions -fno-omit-frame-pointer -w -include stdbool.h
        -DU3_GUARD_PAGE -DU3_OS_ENDIAN_little=1 -DU3_OS_PROF=1 -DU3_OS_linux=1
        -DU3_CPU_x86_64=1 -I pkg -I pkg/noun -I pkg/noun/platform/linux -I pkg/c3
        -I ext/murmur3/vendor -I stubinc)
SRCS=(pkg/c3/defs.c pkg/ur/bitstream.c pkg/ur/hashcons.c ext/murmur3/vendor/murmur3.c
      pkg/noun/allocate.c pkg/noun/events.c pkg/noun/hashtable.c pkg/noun/imprison.c
      pkg/noun/log.c pkg/noun/manage.c pkg/noun/options.c pkg/noun/retrieve.c
      pkg/noun/serial.c pkg/noun/trace.c)

cp "$HERE/driver.c" "$HERE/stubs.c" "$WORK/"
cd "$WORK"
objs=()
for src in "${SRCS[@]}" driver.c stubs.c; do
  obj=$(echo "${src%.c}" | tr / _).o
  echo "+ $CC ${CFLAGS[*]} -c $src -o $obj" >&2
  "$CC" "${CFLAGS[@]}" -c "$src" -o "$obj"
  objs+=("$obj")
done
echo "+ $CC -o driver ${objs[*]} -lgmp -lcrypto -lsigsegv -lunwind" >&2
"$CC" -o driver "${objs[@]}" -lgmp -lcrypto -lsigsegv -lunwind

# vere logs ("loom: mapped 64MB", and the faults of damaged inputs in forked children)
# to stdout/stderr; the vectors go to $OUT only
./driver "$OUT.tmp" > "$WORK/driver.log" 2>&1 || { cat "$WORK/driver.log" >&2; exit 1; }
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT in $(( $(date +%s) - start )) s" >&2
