"""``-o`` mount options: every one falls in exactly one class, and is sorted by it.

* **bookfs's own** (:data:`OWN_OPTIONS`): ``stall_timeout=``, ``follow_timeout=``, ``segment_mb=``,
  ``index_dir=``, ``noindex_cache``, ``readdirplus=``, ``unchecked_payloads``,
  ``busy_poll=``, ``companion``;
* **implemented by bookfs** (:data:`IMPLEMENTED_OPTIONS`), because libfuse 3's low-level
  API no longer does: ``uid=``, ``gid=``, ``umask=``, ``nonempty``;
* **read-only or read-write** (:data:`MODE_OPTIONS`): ``ro``, ``rw``;
* **accepted and ignored** (:data:`IGNORED_OPTIONS`, ``x-*``): fstab / mount(8) /
  mount.fuse bookkeeping and atime variants;
* **passed to FUSE** as given: anything else.  FUSE has the last word (its refusal is
  reported naming the option: ``mount._init_fuse``); bookfs always adds
  :data:`ALWAYS_FUSE` and an ``fsname=`` naming the source.

A bad value, a value where none belongs or a missing one is an :class:`OptionError`
(bad usage: exit status 2) with one line naming the option and what was expected.
:class:`MountError`, the error of a mount that could not be made, is defined here with
it (``mount.py`` re-exports both).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bookfs.formats.segments import DEFAULT_SPAN as DEFAULT_SEGMENT_SPAN
from bookfs.fs.daemon.mountinfo import FSNAME_PREFIX, FUSE_SUBTYPE

DEFAULT_STALL_TIMEOUT = 30.0  # seconds a new/ writer waits for a stalled predecessor
DEFAULT_FOLLOW_TIMEOUT = 10.0  # seconds a follow/ lookup waits (fs/tail.py says why 10)
#: microseconds the daemon polls /dev/fuse before it sleeps, at most (``mainloop.main_options``)
DEFAULT_BUSY_POLL_US = 200


class MountError(Exception):
    """A mount that could not be made; the message is one line for the user."""


class OptionError(MountError):
    """A ``-o`` option bookfs cannot accept (bad usage: exit status 2)."""


# --- values ----------------------------------------------------------------------------------


def _positive_number(what: str):
    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = float("nan")
        if not (x > 0 and x < float("inf")):
            raise ValueError(f"expected a positive number of {what}")
        return x
    return parse


def _microseconds(value: str) -> int:
    if not value.isdigit() or int(value) > 1_000_000:
        raise ValueError("expected a whole number of microseconds from 0 to 1000000")
    return int(value)


def _directory(value: str) -> str:
    if not value:
        raise ValueError("expected a directory path")
    return os.path.abspath(os.path.expanduser(value))


MAX_ID = (1 << 32) - 2  # the largest uid/gid (2**32 - 1 is the kernel's "no id")


def _numeric_id(value: str) -> int:
    n = int(value)
    if n > MAX_ID:
        raise ValueError(f"expected an id from 0 to {MAX_ID}")
    return n


def _named_id(value: str, by_name, what: str) -> int:
    """A numeric id, or the id ``by_name(value)`` gives (KeyError: not a name there)."""
    if value.isdigit():
        return _numeric_id(value)
    try:
        return by_name(value)
    except KeyError:
        raise ValueError(f"expected a numeric {what}") from None


def _user_id(value: str) -> int:
    import pwd

    return _named_id(value, lambda n: pwd.getpwnam(n).pw_uid, "uid or a user name")


def _group_id(value: str) -> int:
    import grp

    return _named_id(value, lambda n: grp.getgrnam(n).gr_gid, "gid or a group name")


def _choice(*values: str):
    def parse(value: str) -> str:
        if value not in values:
            raise ValueError("expected " + " or ".join(values))
        return value
    return parse


def _umask(value: str) -> int:
    try:
        mask = int(value, 8)
    except ValueError:
        mask = -1
    if not 0 <= mask <= 0o777:
        raise ValueError("expected an octal mask from 0 to 777, like 022")
    return mask


# --- the classes -------------------------------------------------------------------------------

#: bookfs's own options: name -> (value parser or None for a flag, what it does).
OWN_OPTIONS = {
    "stall_timeout": (_positive_number("seconds"),
                      "SECONDS a new/ writer waits for a stalled predecessor "
                      f"(default {DEFAULT_STALL_TIMEOUT:g})"),
    "follow_timeout": (_positive_number("seconds"),
                       "SECONDS a lookup of follow/N or a read of follow/next waits for "
                       "the event before it answers ETIMEDOUT (default "
                       f"{DEFAULT_FOLLOW_TIMEOUT:g}; a waiter's Ctrl-C takes effect at the "
                       "latest then)"),
    "segment_mb": (_positive_number("MiB"), "MB: the byte span of each segments/ file "
                   f"(default {DEFAULT_SEGMENT_SPAN >> 20})"),
    "index_dir": (_directory, "DIR: keep the persisted offset index there"),
    "noindex_cache": (None, "never read or write a persisted index (read-only media, "
                      "throwaway mounts)"),
    "single_connection": (None, "read events through the read-write connection too, "
                          "with no read-only companion bound over events/, pretty/, "
                          "segments/ and epochs/ (slower reads; a plain umount works)"),
    "readdirplus": (_choice("always", "auto"), "always|auto: how a listing of events/ "
                    "reaches the kernel.  always (the default): every entry with its "
                    "attributes (READDIRPLUS), so a tool that lists first and stats after "
                    "(Spark's and Hadoop's listing, tar, cp -r) asks nothing more; auto: "
                    "the kernel asks for attributes only while the lister stats as it "
                    "goes (ls -l), so find -type f runs at local-disk speed, but a tool "
                    "that stats after listing pays one lookup per entry"),
    "busy_poll": (_microseconds, "US: before the daemon sleeps waiting for a request, it "
                  "polls /dev/fuse for up to US microseconds (an adaptive window that "
                  "shrinks to nothing while the mount is idle), so a request that follows "
                  "soon is answered without a sleep and a wake-up; 0 never polls "
                  f"(default {DEFAULT_BUSY_POLL_US})"),
    "unchecked_payloads": (None, "accept any bytes of 4 or more as a new/ event, not only "
                           "a 4-byte mug and a jam (or ram) that decodes exactly; for "
                           "logs that store something else (a ship cannot replay it)"),
    "companion": (None, "a read-only mount serving a read-write mount's reads (which "
                  "gives it): the read-write daemon tells the kernel of each commit, so "
                  "between requests this one looks at the log less often (fs/watch.py, "
                  "COMPANION_LOOK_BURST), and its date pass runs only while the log "
                  "rests (fs/dates.py)"),
}
#: Options libfuse 3's low-level API no longer implements, so bookfs does.
IMPLEMENTED_OPTIONS = {
    "uid": (_user_id, "N|NAME: report this owner instead of the log file's"),
    "gid": (_group_id, "N|NAME: report this group instead of the log file's"),
    "umask": (_umask, "OCTAL: permission bits = 0777 & ~umask instead of the log file's "
              "(write bits only on a read-write mount)"),
    "nonempty": (None, "accepted: FUSE 3 always mounts over a non-empty directory"),
}
#: Read-only or read-write (read-write by default).
MODE_OPTIONS = {"ro": "read-only (follows the writer, takes no lock)",
                "rw": "read-write (takes the writer lock; the default)"}
#: fstab / mount(8) / mount.fuse bookkeeping, and atime variants libfuse 3.14 does not
#: know (FUSE leaves atime to the filesystem, and bookfs serves its own times): accepted,
#: no effect.  (mount.fuse itself consumes setuid= and drop_privileges; given to bookfs
#: directly they go to FUSE, which refuses them, rather than being silently dropped.)
IGNORED_OPTIONS = {"defaults", "auto", "noauto", "user", "users", "nouser", "owner",
                   "group", "_netdev", "nofail", "comment", "relatime", "norelatime",
                   "strictatime", "nostrictatime", "lazytime", "nolazytime", "nodiratime",
                   "diratime", "loud", "silent"}
IGNORED_PREFIXES = ("x-",)
#: Options bookfs always gives FUSE (fsname= is added too: bookfs:<source>, unless given).
ALWAYS_FUSE = ("subtype=" + FUSE_SUBTYPE, "default_permissions", "auto_unmount")
#: FUSE options whose value is a number, checked here so that a typo is a usage error
#: (exit 2) before anything is opened, not FUSE's refusal after the log is locked.
FUSE_NUMBERS = {"blksize": "bytes"}
#: Examples of what goes to FUSE untouched (for --help; FUSE decides what it accepts).
FUSE_EXAMPLES = ("dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime",
                 "sync", "async", "dirsync", "allow_other", "allow_root",
                 "fsname=NAME", "blksize=N", "context=...")


@dataclass
class MountOptions:
    """``-o`` options, sorted into what bookfs does with each."""

    readonly: bool = False
    rw: bool = False  # rw given explicitly: refuse to fall back to read-only
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    follow_timeout: float = DEFAULT_FOLLOW_TIMEOUT
    segment_span: int = DEFAULT_SEGMENT_SPAN
    index_dir: str | None = None
    index_cache: bool = True
    unchecked_payloads: bool = False  # new/ accepts any payload (no noun check)
    single_connection: bool = False  # no read-only companion (fs/daemon/companion.py)
    companion: bool = False  # this mount is a read-write mount's companion
    readdirplus: str = "always"  # or "auto" (fs/nodes/dirs.py, "Listings")
    busy_poll: int = DEFAULT_BUSY_POLL_US  # µs polled before sleeping (mainloop.main_options)
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None
    fuse: list[str] = field(default_factory=list)  # handed to FUSE as given
    ignored: list[str] = field(default_factory=list)  # accepted, no effect

    def fuse_options(self, source: str, readonly: bool) -> set[str]:
        """What ``pyfuse3.init`` gets: the pass-through options, bookfs's fixed ones,
        ``ro`` for a read-only mount and an ``fsname`` naming the source."""
        opts = set(self.fuse) | set(ALWAYS_FUSE)
        if not any(o.startswith("fsname=") for o in opts):
            # libfuse splits -o at commas unless escaped with a backslash
            escaped = source.replace("\\", "\\\\").replace(",", "\\,")
            opts.add("fsname=" + FSNAME_PREFIX + escaped)
        opts.discard("rw")
        if readonly:
            opts.add("ro")
        return opts


    def companion_options(self) -> str:
        """The ``-o`` text of a read-write mount's read-only companion
        (``fs/daemon/companion.py``): read-only, the same segments, index, owner and FUSE
        options; its ``fsname=`` is bookfs's own, naming the source."""
        out = ["ro", "companion", f"segment_mb={self.segment_span / (1 << 20)!r}",
               f"readdirplus={self.readdirplus}", f"busy_poll={self.busy_poll}"]
        if self.index_dir:
            out.append(f"index_dir={self.index_dir}")
        if not self.index_cache:
            out.append("noindex_cache")
        for key in ("uid", "gid"):
            if getattr(self, key) is not None:
                out.append(f"{key}={getattr(self, key)}")
        if self.umask is not None:
            out.append(f"umask={self.umask:o}")
        return ",".join(out + [o for o in self.fuse if not o.startswith("fsname=")])


def parse_options(text: str | None) -> MountOptions:
    """Sort ``-o`` text (``ro,nodev,uid=1000,stall_timeout=5``) into :class:`MountOptions`.
    bookfs's own and implemented options get their values checked; a bad value, a value
    where none belongs or a missing one raises :class:`OptionError` with one line naming
    the option and what was expected.  Bookkeeping options are accepted and ignored;
    everything else is kept for FUSE."""
    mo = MountOptions()
    for item in filter(None, (text or "").split(",")):
        key, eq, value = item.partition("=")
        if key in MODE_OPTIONS:
            if eq:
                raise OptionError(f"mount option {key!r} takes no value")
            setattr(mo, "readonly" if key == "ro" else "rw", True)
        elif key in OWN_OPTIONS or key in IMPLEMENTED_OPTIONS:
            parse, _ = OWN_OPTIONS.get(key) or IMPLEMENTED_OPTIONS[key]
            if parse is None:
                if eq:
                    raise OptionError(f"mount option {key!r} takes no value")
                if key == "noindex_cache":
                    mo.index_cache = False
                elif key == "unchecked_payloads":
                    mo.unchecked_payloads = True
                elif key == "single_connection":
                    mo.single_connection = True
                elif key == "companion":
                    mo.companion = True
                continue  # nonempty
            if not eq:
                raise OptionError(f"mount option {key!r} needs a value: {key}=...")
            try:
                parsed = parse(value)
            except ValueError as e:
                raise OptionError(f"mount option {key}={value!r}: {e}") from None
            if key == "segment_mb":
                mo.segment_span = max(1, int(parsed * (1 << 20)))
            else:
                setattr(mo, key, parsed)
        elif key == "subtype":
            raise OptionError(f"mount option {item!r}: a bookfs mount's subtype is always "
                              f"{FUSE_SUBTYPE} (bookfs umount finds its mounts by it)")
        elif key in IGNORED_OPTIONS or key.startswith(IGNORED_PREFIXES):
            mo.ignored.append(item)
        else:
            if key == "max_read":
                # pyfuse3's init handler leaves the connection's max_read at 0, and libfuse
                # then ends the session on its first request ("init() and
                # fuse_session_new() requested different maximum read size"): a mount
                # that unmounts itself at once.  Refused here, before anything is opened.
                raise OptionError(f"mount option {item!r} is not supported: pyfuse3 cannot "
                                  "pass it on, and libfuse would end the mount at once; "
                                  "leave it out (FUSE sizes reads itself)")
            if key in FUSE_NUMBERS and not (eq and value.isdigit()):
                # FUSE would refuse it only once the log is open (and locked)
                raise OptionError(f"mount option {item!r}: expected {key}=N, N a number of "
                                  f"{FUSE_NUMBERS[key]}")
            mo.fuse.append(item)
    if mo.readonly and mo.rw:
        raise OptionError("options ro and rw contradict each other; expected one of them")
    if mo.companion and not mo.readonly:
        raise OptionError("option companion needs ro: a companion serves reads only")
    if mo.index_dir and not mo.index_cache:
        raise OptionError("options index_dir and noindex_cache contradict each other")
    return mo


def options_help() -> str:
    """The ``-o`` options by class, for ``bookfs mount --help``."""
    import textwrap

    def rows(table):
        return "\n".join(textwrap.fill(v[1] if isinstance(v, tuple) else v, 78,
                                       initial_indent=f"  {k:<15} ",
                                       subsequent_indent=" " * 18)
                         for k, v in table.items())

    def words(items):
        return textwrap.fill(", ".join(items), 78, initial_indent="  ",
                             subsequent_indent="  ")

    return "\n".join([
        "mount options (-o, comma-separated):",
        "read-only or read-write:", rows(MODE_OPTIONS),
        "bookfs's own:", rows(OWN_OPTIONS),
        "implemented by bookfs (libfuse 3 dropped them):", rows(IMPLEMENTED_OPTIONS),
        "passed to FUSE as given (FUSE refuses what it does not know), e.g.:",
        words(FUSE_EXAMPLES),
        "accepted and ignored (fstab/mount bookkeeping, atime variants):",
        words([*sorted(IGNORED_OPTIONS), "x-*"]),
        "always on:", words([*ALWAYS_FUSE, "fsname=bookfs:SOURCE"]),
    ])
