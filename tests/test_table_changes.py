"""Issue 33, item 1: the writer's descriptor table changes between create and close.

A task's table is replaced while it lives, by a copy, only when another task shares it
(``closer.Writer``'s docstring cites the kernel): ``unshare(CLONE_FILES)``,
``close_range(..., CLOSE_RANGE_UNSHARE)`` and an ``exec`` of a table shared with another
process.  Before, the creating thread's close from its new table was taken for a copy's:
it returned 0 with nothing committed, and a kill of the process then lost the event.  Now
every such close fails loudly (EIO) and nothing is committed, whatever the process does
after (exits, is killed).  Each way is driven by a real process through a real mount.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from mount_fixtures import (  # noqa: F401  (fixtures)
    engine_events,
    mnt,
    mounted,
    payload,
    small_src,
    wait_for,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
                                reason="needs root and /dev/fuse")

#: thread T creates new/N and writes half, then changes its table while the main thread
#: (which shares it) lives on, writes the rest (or not), closes, and prints the outcome;
#: then the process exits, or waits to be killed
PY_WRITER = r"""
import ctypes, errno, os, sys, threading, time
path, how, more, end = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
data = bytes.fromhex(sys.argv[5])
libc = ctypes.CDLL(None, use_errno=True)
out = []

def writer():
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)
    half = len(data) // 2
    os.write(fd, data[:half])
    if how == "unshare":
        rc = libc.unshare(0x400)  # CLONE_FILES
    else:  # close_range(fd + 1, ~0, CLOSE_RANGE_UNSHARE)
        rc = libc.syscall(436, fd + 1, 0xFFFFFFFF, 2)
    if rc != 0:
        out.append(f"setup-failed {ctypes.get_errno()}")
        return
    if more:
        os.write(fd, data[half:])
    try:
        os.close(fd)
        out.append("closed 0")
    except OSError as e:
        out.append(f"closed {errno.errorcode[e.errno]}")

t = threading.Thread(target=writer)
t.start()
t.join()
print(out[0], flush=True)
if end == "kill":
    time.sleep(60)  # killed by the test
"""

#: process P creates new/N (no O_CLOEXEC) as fd 3 and writes it all, clones Q with
#: CLONE_FILES (one table, two processes), then execs a shell that closes fd 3 (exec
#: copies the shared table first); Q closes its fd 3 a moment later and exits
C_EXEC_SHARED = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char stack[1 << 16];
static int child(void *arg) {
    (void)arg;
    usleep(300000);
    int rc = close(3);
    dprintf(2, "child close %s\n", rc == 0 ? "0" : strerror(errno));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--close3") == 0) {  /* after the exec */
        int rc = close(3);
        printf("closed %s\n", rc == 0 ? "0" : (errno == EIO ? "EIO" : strerror(errno)));
        return 0;
    }
    int fd = open(argv[1], O_WRONLY | O_CREAT, 0644);
    if (fd < 0 || dup2(fd, 3) < 0) return 2;
    if (fd != 3) close(fd);
    size_t n = strlen(argv[2]) / 2;
    unsigned char *buf = malloc(n);
    for (size_t i = 0; i < n; i++) sscanf(argv[2] + 2 * i, "%2hhx", &buf[i]);
    if (write(3, buf, n) != (ssize_t)n) return 3;
    if (clone(child, stack + sizeof stack, CLONE_FILES | SIGCHLD, NULL) < 0) return 4;
    execl("/proc/self/exe", argv[0], "--close3", (char *)0);
    return 5;
}
"""


def _run_py(mnt, n: int, how: str, more: bool, end: str) -> tuple[str, subprocess.Popen]:
    data = payload(n, 600)
    proc = subprocess.Popen([sys.executable, "-c", PY_WRITER, f"{mnt}/new/{n}", how,
                             "1" if more else "0", end, data.hex()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    return line, proc


@pytest.mark.parametrize("end", ["exit", "kill"])
@pytest.mark.parametrize("more", [False, True], ids=["close-at-once", "write-then-close"])
@pytest.mark.parametrize("how", ["unshare", "close_range"])
def test_a_close_from_a_changed_table_fails_and_commits_nothing(small_src, mnt, how, more,
                                                                 end):
    """The creating thread's close after its table changed gets EIO, never 0; nothing is
    committed then, nor when the process exits or is killed; the number stays free."""
    with mounted(small_src, mnt):
        n = len(os.listdir(f"{mnt}/events")) + 1
        line, proc = _run_py(mnt, n, how, more, end)
        if end == "kill":
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert line == "closed EIO", (line, proc.stderr.read())
        assert not os.path.exists(f"{mnt}/events/{n}")
        assert "its writer's descriptor table changed" in open(f"{mnt}/info").read()
        with open(f"{mnt}/new/{n}", "wb") as f:  # the number is free, and appends work
            f.write(payload(n, 100))
    assert engine_events(small_src)[n] == payload(n, 100)


@pytest.fixture(scope="module")
def exec_shared(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("exec-shared")
    (d / "exec_shared.c").write_text(textwrap.dedent(C_EXEC_SHARED))
    subprocess.run(["gcc", "-O1", "-o", str(d / "exec_shared"), str(d / "exec_shared.c")],
                   check=True)
    return str(d / "exec_shared")


def test_an_exec_of_a_table_shared_with_another_process_fails_and_commits_nothing(
        small_src, mnt, exec_shared):
    """P writes the event, shares its table with Q (``clone(CLONE_FILES)``), then execs a
    shell that closes it: the exec copied the table, so that close is the creating
    thread's from another table: EIO; Q's close of the original later commits nothing."""
    with mounted(small_src, mnt):
        n = len(os.listdir(f"{mnt}/events")) + 1
        proc = subprocess.Popen([exec_shared, f"{mnt}/new/{n}", payload(n, 300).hex()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=60)
        assert out.strip() == "closed EIO", out
        wait_for(lambda: not os.path.exists(f"/proc/{proc.pid}"), 10)  # Q's close too
        assert not os.path.exists(f"{mnt}/events/{n}")
        with open(f"{mnt}/new/{n}", "wb") as f:
            f.write(payload(n, 100))
    assert engine_events(small_src)[n] == payload(n, 100)


def test_a_table_shared_by_no_one_is_not_copied_and_the_close_commits(small_src, mnt):
    """``unshare(CLONE_FILES)`` in a process with one thread copies nothing (the table is
    not shared), so its close is the writer's and commits, as before."""
    script = textwrap.dedent(r"""
        import ctypes, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
        os.write(fd, bytes.fromhex(sys.argv[2]))
        assert libc.unshare(0x400) == 0
        os.close(fd)
        print("closed 0")
    """)
    with mounted(small_src, mnt):
        n = len(os.listdir(f"{mnt}/events")) + 1
        res = subprocess.run([sys.executable, "-c", script, f"{mnt}/new/{n}",
                              payload(n, 200).hex()], capture_output=True, text=True,
                             timeout=60)
        assert res.stdout.strip() == "closed 0", res.stderr
        assert open(f"{mnt}/events/{n}", "rb").read() == payload(n, 200)
