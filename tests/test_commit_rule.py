"""The commit rule (issue 18), through real mounts: which close of ``new/N`` (and of a
``meta/`` field) commits, decided from what the kernel sends with each request.

Each writer is its own process, run with a timeout, so a mount that hangs fails the test
instead of hanging the suite.  The table of issue 18, row by row:

1. ``os.system``, ``os.posix_spawn``, ``fork``+``execv``, ``subprocess.run`` (and a
   ``dup``) between two writes, and a writer that ``exec``s itself after writing, on
   ``new/`` and on ``meta/life``: no hang; both parts, committed once, at the writer's
   close (at the exec for the self-exec);
2. the same through a bind mount of the mount point, after the mount point's parent was
   renamed, and after ``umount -l``;
3. tools: ``cp``, ``printf > new/N``, ``{ a; b; } > new/N``, ``dd``, Python ``with open``,
   8 threads: exactly the bytes written;
4. a writer SIGKILLed mid-event, with or without a child that keeps its descriptor:
   nothing committed, ever, and the number is free again;
5. the PID counter wrapped between create and close: no early commit;
6. a descriptor passed over a UNIX socket to an unrelated process that writes and closes
   last: a clear error to that process, nothing committed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bookfs.formats.book import Book
from mounting import noun, octal, proc_gone
from mount_fixtures import (  # noqa: F401  (fixtures)
    engine_events,
    mounted,
    small_src,
    threaded_appends,
    wait_for,
)

NEXT = 11  # small_src holds events 1..10
TIMEOUT = 30  # seconds a writer may take; the old rule hung here for good

#: The writer: opens new/N (or meta/life), writes part one, starts a process (or dups),
#: writes part two, checks nothing is committed yet, closes (or execs itself).  Prints
#: "ok" when every check passed.
#: What the writer appends (a checked new/ takes a mug and a noun), in two parts.
EVENT = noun(b"part-one;part-two")
PARTS = [EVENT[:13], EVENT[13:]]

WRITER = r"""
import os, subprocess, sys
root, n, kind, target = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if target == "new":
    path, flags = f"{root}/new/{n}", os.O_WRONLY | os.O_CREAT
    parts = NEW_PARTS
else:
    path, flags = f"{root}/meta/life", os.O_WRONLY | os.O_TRUNC
    parts = [b"\x07\x00", b"\x00\x00"]

def committed():
    if target == "new":
        return os.path.exists(f"{root}/events/{n}")
    with open(f"{root}/meta/life", "rb") as f:
        return f.read() == b"".join(parts)

if kind == "exec-check":  # the self-exec's second life: committed at the exec
    assert committed(), "not committed at the exec"
    print("ok")
    sys.exit(0)
fd = os.open(path, flags)
os.write(fd, parts[0])
if kind == "system":
    assert os.system("true") == 0
elif kind == "posix_spawn":
    pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    os.waitpid(pid, 0)
elif kind == "fork+execv":
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/true", ["true"])
    os.waitpid(pid, 0)
elif kind == "subprocess":
    subprocess.run(["true"], check=True)
elif kind == "dup":
    os.close(os.dup(fd))
elif kind == "wrapped":  # the PID counter wraps, then a child starts
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write("300")
    r = subprocess.run(["sh", "-c", "echo $$"], check=True, capture_output=True)
    assert int(r.stdout) < os.getpid(), "the PID counter did not wrap"
os.write(fd, parts[1])
assert not committed(), "committed before the writer's close"
if kind == "self-exec":
    os.execv(sys.executable, [sys.executable, "-c", SCRIPT, root, str(n), "exec-check",
                              target])
os.close(fd)
assert committed(), "not committed at the writer's close"
print("ok")
""".replace("NEW_PARTS", repr(PARTS))

KINDS = ["system", "posix_spawn", "fork+execv", "subprocess", "dup", "self-exec"]


def run_writer(root, kind: str, target: str = "new", n: int = NEXT):
    script = "SCRIPT = " + repr(WRITER) + "\n" + WRITER
    r = subprocess.run([sys.executable, "-c", script, str(root), str(n), kind, target],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@contextlib.contextmanager
def reached(how: str, src: Path, tmp_path: Path):
    """Mount ``src`` and yield the path a writer reaches it by: the mount point itself,
    a bind mount of it, the mount point after its parent was renamed, or (after ``umount
    -l``) the detached mount through a directory descriptor this process holds."""
    parent = tmp_path / "where"
    mnt = parent / "mnt"
    mnt.mkdir(parents=True)
    with mounted(src, mnt):
        if how == "direct":
            yield mnt
        elif how == "bind":
            bind = tmp_path / "bind"
            bind.mkdir()
            subprocess.run(["mount", "--bind", str(mnt), str(bind)], check=True)
            try:
                yield bind
            finally:
                subprocess.run(["umount", "-l", str(bind)], check=True)
        elif how == "renamed":
            moved = tmp_path / "moved"
            parent.rename(moved)
            try:
                yield moved / "mnt"
            finally:
                moved.rename(parent)
        elif how == "umount -l":
            dirfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
            try:
                subprocess.run(["umount", "-l", str(mnt)], check=True)
                yield Path(f"/proc/{os.getpid()}/fd/{dirfd}")
            finally:
                os.close(dirfd)  # the detached mount goes away, and its daemon with it
        else:
            raise ValueError(how)


PATHS = ["direct", "bind", "renamed", "umount -l"]


@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_process_started_between_two_writes_commits_nothing(small_src, tmp_path, how,
                                                              kind):
    with reached(how, small_src, tmp_path) as root:
        run_writer(root, kind)
        with open(f"{root}/events/{NEXT}", "rb") as f:
            assert f.read() == EVENT
        assert len(os.listdir(f"{root}/events")) == NEXT  # committed once
        with open(f"{root}/info") as f:
            assert "last refusals: none" in f.read()


@pytest.mark.parametrize("how", ["direct", "bind"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_same_on_a_meta_field(small_src, tmp_path, how, kind):
    with reached(how, small_src, tmp_path) as root:
        run_writer(root, kind, target="meta")
    with Book.open(small_src) as book:
        assert book.read_meta("life") == b"\x07\x00\x00\x00"


# --- 3. tools -------------------------------------------------------------------------


TOOL_DATA = noun(b"AAAABBBB")  # what each tool writes: a mug and a noun

TOOLS = {
    "cp": "cp {src} {f}",
    "printf builtin": f"printf '{octal(TOOL_DATA)}' > {{f}}",
    "{ a; b; }": f"{{{{ /usr/bin/printf '{octal(TOOL_DATA[:8])}'; "
                 f"/usr/bin/printf '{octal(TOOL_DATA[8:])}'; }}}} > {{f}}",
    "exec 3>": f"exec 3> {{f}}; printf '{octal(TOOL_DATA[:8])}' >&3; "
               f"printf '{octal(TOOL_DATA[8:])}' >&3; exec 3>&-",
    "dd": "dd if={src} of={f} bs=3 status=none",
    "python with open": f"{sys.executable} -c \"import sys; "
                        "f = open(sys.argv[1], 'wb'); f.write(open(sys.argv[2], 'rb').read()); "
                        "f.close()\" {f} {src}",
}


@pytest.mark.parametrize("tool", list(TOOLS))
def test_tools_commit_exactly_the_bytes_written(small_src, tmp_path, tool):
    data = TOOL_DATA
    (tmp_path / "payload").write_bytes(data)
    with reached("bind", small_src, tmp_path) as root:
        cmd = TOOLS[tool].format(src=tmp_path / "payload", f=f"{root}/new/{NEXT}")
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        with open(f"{root}/events/{NEXT}", "rb") as f:
            assert f.read() == data


def test_eight_threads_appending(small_src, tmp_path):
    with reached("direct", small_src, tmp_path) as root:
        acked, failed = threaded_appends(root, NEXT, 8, 25, lambda n: 4 + n % 5000, 7)
    assert not failed
    got = engine_events(small_src)
    assert len(acked) == 200 and all(got[n] == data for n, data in acked.items())


# --- 4. a killed writer --------------------------------------------------------------


KILLED_WRITER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
os.write(fd, b"\0\0\0\0half of an event")
child = ""
if sys.argv[2] == "child":  # a child keeps a copy and exits normally 1.5 s later
    os.set_inheritable(fd, True)
    child = os.fork()
    if child == 0:
        time.sleep(1.5)
        os._exit(0)
print("ready", child, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("child", ["alone", "child"])
@pytest.mark.parametrize("writer", ["python", "shell"])
def test_a_killed_writer_commits_nothing(small_src, tmp_path, writer, child):
    with reached("direct", small_src, tmp_path) as root:
        f = f"{root}/new/{NEXT}"
        if writer == "python":
            cmd = [sys.executable, "-c", KILLED_WRITER, f, child]
        else:  # a shell writing new/N, its background child holding its stdout
            bg = "(sleep 1.5) & " if child == "child" else ""  # `read` is a builtin: no child
            pid = "$!" if child == "child" else ""
            cmd = ["bash", "-c", f"{{ printf '\\0\\0\\0\\0half'; {bg}echo ready {pid} >&2; "
                                 f"read -r line; }} > {f}"]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        stream = p.stdout if writer == "python" else p.stderr
        ready, *kid = stream.readline().split()
        assert ready == b"ready" and len(kid) == (child == "child")
        p.kill()
        p.wait(timeout=TIMEOUT)
        for pid in kid:  # the child has exited normally (its copy's close is done)
            assert wait_for(lambda: _gone(int(pid)), TIMEOUT), f"child {pid} still there"
        time.sleep(0.5)  # the kernel's RELEASE of the file (sent after the last close)
        assert not os.path.exists(f"{root}/events/{NEXT}")
        with open(f, "wb") as w:  # the number is free again
            w.write(noun(b"\0\0\0\0whole"))
        with open(f"{root}/events/{NEXT}", "rb") as r:
            assert r.read() == noun(b"\0\0\0\0whole")
        with open(f"{root}/info") as i:
            assert "killed" in i.read()
    assert engine_events(small_src)[NEXT] == noun(b"\0\0\0\0whole")


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie nobody reaped yet)."""
    return proc_gone(pid)


# --- 5. the PID counter wraps ---------------------------------------------------------


def test_pid_counter_wrapped_between_create_and_close(small_src, tmp_path):
    with reached("direct", small_src, tmp_path) as root:
        run_writer(root, "wrapped")
        with open(f"{root}/events/{NEXT}", "rb") as f:
            assert f.read() == EVENT


# --- 6. a descriptor passed over a UNIX socket -----------------------------------------


RECEIVER = r"""
import errno, os, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
msg, fds, _, _ = socket.recv_fds(s, 16, 1)
fd = fds[0]
s.recv(1)  # the writer has closed its own descriptor
try:
    os.write(fd, b"\0\0\0\0from the receiver")
    os.close(fd)
    print("committed")
except OSError as e:
    print(errno.errorcode[e.errno])
"""


def test_a_descriptor_passed_over_a_socket(small_src, tmp_path):
    """The receiver, started before the file existed, writes and closes last: it gets a
    clear error, and nothing is committed (the writer's own close was the last close of
    its table, with nothing written)."""
    with reached("direct", small_src, tmp_path) as root:
        ours, theirs = socket.socketpair()
        receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(theirs.fileno())],
                                    pass_fds=[theirs.fileno()], stdout=subprocess.PIPE,
                                    text=True)
        theirs.close()
        fd = os.open(f"{root}/new/{NEXT}", os.O_WRONLY | os.O_CREAT)
        socket.send_fds(ours, [b"x"], [fd])
        try:
            os.close(fd)
        except OSError as e:
            assert e.errno == errno.EINVAL  # an empty event, refused
        ours.send(b"g")
        out, _ = receiver.communicate(timeout=TIMEOUT)
        assert out.strip() == "EBADF"
        assert not os.path.exists(f"{root}/events/{NEXT}")
    assert NEXT not in engine_events(small_src)


# --- stock pyfuse3 ---------------------------------------------------------------------


def test_stock_pyfuse3_refuses_appends_and_meta_writes(small_src, tmp_path, monkeypatch):
    """Without the patch nothing says which process closes a file: ``new/`` and ``meta/``
    writes are refused (EROFS) with a line that says what to do, and nothing changes."""
    monkeypatch.setenv("BOOKFS_STOCK_PYFUSE3", "1")  # the daemon inherits it
    with reached("direct", small_src, tmp_path) as root:
        for path, flags in ((f"{root}/new/{NEXT}", os.O_WRONLY | os.O_CREAT),
                            (f"{root}/meta/life", os.O_WRONLY)):
            with pytest.raises(OSError) as e:
                os.close(os.open(path, flags))
            assert e.value.errno == errno.EROFS
        with open(f"{root}/info") as f:
            info = f.read()
        assert "appends and meta writes refused" in info
        assert "need pyfuse3 built with bookfs's patch" in info
    assert NEXT not in engine_events(small_src)


def test_a_thread_spawns_before_its_first_write(small_src, tmp_path):
    """A writer thread (not its process's leader) creates new/N and starts a subprocess
    before it writes anything: the child's close (its exec) comes before the writer's
    table is known.  It is told a copy's (the creating thread is alive, in another
    process) before anything is frozen, so the writer's writes go on."""
    result: list = []

    def writer(root):
        try:
            fd = os.open(f"{root}/new/{NEXT}", os.O_WRONLY | os.O_CREAT)
            subprocess.run(["true"], check=True)
            os.write(fd, noun(b"\0\0\0\0after the child"))
            os.close(fd)
            result.append("ok")
        except OSError as e:
            result.append(e)

    with reached("direct", small_src, tmp_path) as root:
        t = threading.Thread(target=writer, args=(root,))
        t.start()
        t.join(TIMEOUT)
        assert result == ["ok"]
        with open(f"{root}/events/{NEXT}", "rb") as f:
            assert f.read() == noun(b"\0\0\0\0after the child")


def test_created_in_one_thread_written_and_closed_in_another(small_src, tmp_path):
    """A thread pool: one thread creates new/N, another writes it (with a subprocess
    between its writes) and closes it.  The child's close is told a copy's and the
    closing thread the writer's (the creating thread is alive, in that thread group),
    and the close commits both parts."""
    fds: list = []
    done = threading.Event()

    def pool_thread():
        fds.append(os.open(f"{root}/new/{NEXT}", os.O_WRONLY | os.O_CREAT))
        done.wait(TIMEOUT)  # the pool's thread lives on

    with reached("direct", small_src, tmp_path) as root:
        t = threading.Thread(target=pool_thread)
        t.start()
        try:
            assert wait_for(lambda: fds)
            os.write(fds[0], noun(b"one;two")[:8])
            subprocess.run(["true"], check=True)
            os.write(fds[0], noun(b"one;two")[8:])
            os.close(fds[0])
        finally:
            done.set()
            t.join()
        with open(f"{root}/events/{NEXT}", "rb") as f:
            assert f.read() == noun(b"one;two")


def test_a_creating_thread_that_ended_fails_loudly(small_src, tmp_path):
    """The limit, stated: the creating thread has ended before anything told its
    process's table, and a forked child closes a copy.  Nothing tells whether the child
    is the writer's, so the append fails: the writer's next write gets EBADF, nothing is
    committed, the close fails with EIO, and info says why."""
    fds: list = []
    with reached("direct", small_src, tmp_path) as root:
        t = threading.Thread(target=lambda: fds.append(
            os.open(f"{root}/new/{NEXT}", os.O_WRONLY | os.O_CREAT)))
        t.start()
        t.join()
        assert wait_for(lambda: not os.path.exists(f"/proc/self/task/{t.native_id}"))
        subprocess.run(["true"], check=True)  # its exec closes a copy
        with pytest.raises(OSError) as e:
            os.write(fds[0], b"\0\0\0\0data")
        assert e.value.errno == errno.EBADF
        with pytest.raises(OSError) as e:
            os.close(fds[0])  # the close says it too
        assert e.value.errno == errno.EIO
        assert not os.path.exists(f"{root}/events/{NEXT}")
        with open(f"{root}/info") as f:
            assert "has ended" in f.read()


def test_two_opens_of_a_meta_field_in_one_process(small_src, tmp_path):
    """Every open of meta/life shares one inode, so a second open in the writer's table
    looks like a dup: the close of the first, with the whole field written, still saves
    it (its close returned 0), and the second's close saves its own value after it."""
    with reached("direct", small_src, tmp_path) as root:
        first = os.open(f"{root}/meta/life", os.O_WRONLY)
        second = os.open(f"{root}/meta/life", os.O_WRONLY)
        os.write(first, b"\x05\x00\x00\x00")
        os.close(first)
        with open(f"{root}/meta/life", "rb") as f:
            assert f.read() == b"\x05\x00\x00\x00"
        os.write(second, b"\x06\x00\x00\x00")
        os.close(second)
    with Book.open(small_src) as book:
        assert book.read_meta("life") == b"\x06\x00\x00\x00"


def _mount_id(path: Path) -> int:
    """The mount ID of the mount at ``path`` (this process's /proc/self/mountinfo)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path):
                found = int(fields[0])
    return found


@pytest.mark.parametrize("target", ["new", "meta"])
def test_a_bind_mount_that_reuses_a_freed_mount_id(small_src, tmp_path, target):
    """The kernel reuses a freed mount ID (``fs/namespace.c``: ``mnt_alloc_id()`` takes the
    first free key of ``mnt_id_xa``, ``mnt_free_id()`` erases it). The daemon learnt every mount's ID
    when it started; an ID it had seen on another filesystem, freed and then given to a bind
    mount of this mount, must count as this mount's, or the dup's close of a file reached
    through that bind mount is misjudged (it failed with EINVAL)."""
    churn = tmp_path / "churn"
    churn.mkdir()
    parent = tmp_path / "where"
    mnt = parent / "mnt"
    mnt.mkdir(parents=True)
    bind = tmp_path / "bind"
    bind.mkdir()
    reused = False
    for _ in range(5):  # the lowest free ID is normally the one just freed; retry if not
        subprocess.run(["mount", "-t", "tmpfs", "none", str(churn)], check=True)
        churn_id = _mount_id(churn)
        with mounted(small_src, mnt):  # the daemon reads the mount table: churn is tmpfs
            subprocess.run(["umount", str(churn)], check=True)
            subprocess.run(["mount", "--bind", str(mnt), str(bind)], check=True)
            try:
                if _mount_id(bind) != churn_id:
                    continue
                reused = True
                run_writer(bind, "dup", target=target)
                if target == "new":
                    with open(f"{bind}/events/{NEXT}", "rb") as f:
                        assert f.read() == EVENT
            finally:
                subprocess.run(["umount", "-l", str(bind)], check=True)
        break
    if not reused:
        pytest.skip("the kernel gave the bind mount another ID five times")
    if target == "meta":
        with Book.open(small_src) as book:
            assert book.read_meta("life") == b"\x07\x00\x00\x00"
