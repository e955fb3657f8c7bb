"""The ``bookfs`` command.  Every subcommand has ``--help``.  Errors are one line on stderr,
``bookfs COMMAND: message``, never a traceback for a user's mistake: exit status 2 for bad
usage (arguments refused before anything is done: see ``cliargs``), 1 for an operation
that failed (a log that does not open, a disk error), 130 after Ctrl-C.  A bug (any other
exception) still shows its traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from bookfs import __version__
from bookfs.cli import args as cliargs

DEFAULT_SAMPLE_EVENTS = 100_000


def _progress_bar(total: int, desc: str, unit: str = "B"):
    """A tqdm bar on stderr (silent when stderr is not a terminal and BOOKFS_PROGRESS is
    unset, so scripts and CI logs stay readable)."""
    from tqdm import tqdm

    disable = not sys.stderr.isatty() and not os.environ.get("BOOKFS_PROGRESS")
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=disable,
                mininterval=0.5, leave=False)


class _SigintFlag:
    """While active, a first Ctrl-C (SIGINT) only sets ``.hit`` instead of raising
    ``KeyboardInterrupt``, so a command can stop at its next safe point and say what it
    left; a second one raises ``KeyboardInterrupt`` at once, unless ``defer``: then every
    Ctrl-C waits until the block ends (a step that must not stop half-way, such as
    publishing a Spark run).  Calling the object returns ``.hit``.  The previous handler
    is restored on exit."""

    def __init__(self, defer: bool = False):
        self.hit = False
        self.defer = defer

    def __enter__(self):
        import signal

        self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.hit and not self.defer:
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *exc):
        import signal

        signal.signal(signal.SIGINT, self._old)

    def __call__(self) -> bool:
        return self.hit


def cmd_sample(args) -> int:
    from bookfs.cli.args import EXIT_INTERRUPTED
    from bookfs.cli.sample import write_sample

    with _progress_bar(args.events, "sample", unit="ev") as bar, _SigintFlag() as stop:
        res = write_sample(args.dir, args.events, args.seed, force=args.force,
                           progress=bar.update, stop=stop)
    if res.interrupted:
        print(f"bookfs sample: interrupted after event {res.last} of {args.events}; "
              f"{args.dir} holds events 1..{res.last}; run the same command again to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    how = (" (replaced the sample that was there)" if res.replaced else
           f" (resumed after event {res.resumed})" if res.resumed and res.resumed < res.last
           else " (already complete: nothing written)" if res.resumed else "")
    print(f"bookfs sample: wrote events 1..{res.last} ({res.log_bytes:,} bytes) to "
          f"{args.dir}{how}")
    return 0


def cmd_info(args) -> int:
    from bookfs.cli.fleetinfo import fleet_summary, is_fleet_mount, render_fleet
    from bookfs.formats.info import render, summary
    from bookfs.formats.pier import open_source

    if is_fleet_mount(args.path):
        with _progress_bar(len(os.listdir(args.path)), "ships", unit="ship") as bar:
            fleet = fleet_summary(args.path, progress=bar.update)
        sys.stdout.write(render_fleet(fleet, as_json=args.json))
        return 0

    with _progress_bar(None, "indexing") as bar, open_source(args.path,
                                                             progress=bar.update) as book:
        info = summary(book)
        report = getattr(book, "recovery", None)
        if report is not None and not report.clean:
            info["damage"] = str(report)
    sys.stdout.write(render(info, as_json=args.json))
    return 0


def _open_damage(log) -> list[str]:
    """What opening ``log`` (each epoch of a pier) found wrong: bytes past the valid
    prefix, a batch rolled back, a damaged header slot.  Empty for a clean log."""
    logs = [e.log for e in log.epochs] if hasattr(log, "epochs") else [log]
    out = []
    for lg in logs:
        rep = getattr(lg, "recovery", None)
        if rep is None or rep.clean:
            continue
        path = getattr(lg, "log_path", lg.directory)
        if rep.bad_region is not None:
            off, n = rep.bad_region
            out.append(f"{path}: {n} bytes at offset {off} are not valid committed deeds "
                       "(see bookfs fsck)")
        for attr in ("rolled_back",):
            span = getattr(rep, attr, None)
            if span is not None:
                out.append(f"{path}: events {span[0]}..{span[1]} that a header names are "
                           "not all on disk (see bookfs fsck)")
        out += [f"{path}: header {w}" for w in getattr(rep, "bad_slots", [])]
        out += [f"{path}: {n}" for n in rep.notes if not out]
    return out


def cmd_verify(args) -> int:
    from bookfs.formats.nouncheck import MUGS_NOTE, bob_dir_for, check_nouns
    from bookfs.formats.pier import open_source
    from bookfs.formats.reports import CheckReport

    if args.mugs:
        print(f"bookfs verify: note: {MUGS_NOTE}", file=sys.stderr)
    with open_source(args.path) as log:
        what = {"book-v1": "every CRC checks", "vere-book": "every deed frames and the "
                "newest batch's CRC checks", "lmdb": "every event reads"}
        kinds = sorted({w.split(" ")[0] for w in
                        ([e.log.format for e in log.epochs] if hasattr(log, "epochs")
                         else [log.format])})
        with _progress_bar(log.log_bytes, "verify") as bar:
            bad = log.verify(progress=bar.update)
        for event, off in bad:
            print(f"event {event} at offset {off}: fails its {log.format} check")
        damaged = _open_damage(log)
        for line in damaged:
            print(line)
        nouns = None
        if args.nouns or args.mugs:
            nouns = CheckReport(log.directory, log.format)
            with _progress_bar(log.log_bytes, "nouns") as bar:
                check_nouns(log, nouns, bob_dir=bob_dir_for(log.directory),
                            progress=bar.update, crc_failed={e for e, _ in bad})
            for p in nouns.problems:
                print(p.message)
        if nouns is not None:
            k = len(nouns.problems)
            print(f"nouns: {nouns.nouns_checked} events decode-checked "
                  f"({nouns.nouns_ram} in the ram encoding); "
                  + (f"{k} do not decode (reported only: nothing was repaired or cut)"
                     if k else "every one decodes"))
        if bad or damaged or (nouns is not None and nouns.problems):
            return 1
        said = "; ".join(what.get(k, k) for k in kinds)
        if nouns is not None:
            said += "; every event decodes"
        print(f"{log.format}: {log.count} events, {log.log_bytes:,} bytes: {said}")
    return 0


def cmd_mount(args) -> int:
    from bookfs.fs.daemon.mount import mount

    opts = args.options
    if args.fleet:
        from bookfs.fs.fleet.daemon import mount_fleet

        return mount_fleet(args.source, args.mountpoint, options=opts,
                           foreground=args.foreground, debug=args.debug,
                           log_file=args.log_file, max_open=args.max_open,
                           idle_close=args.idle_close, ships_ahead=args.ships_ahead)
    return mount(args.source, args.mountpoint, options=opts, foreground=args.foreground,
                 debug=args.debug, log_file=args.log_file)


def cmd_umount(args) -> int:
    from bookfs.fs.daemon.mount import MountError, umount

    try:
        return umount(args.mountpoint, lazy=args.lazy)
    except MountError as e:
        users = users_of(os.path.realpath(args.mountpoint)) if "busy" in str(e) else ""
        if not users:
            raise
        raise MountError(f"{e}; held by {users}") from None


def users_of(path: str, most: int = 5) -> str:
    """The processes holding ``path`` (a mount point) busy, as ``bookfs umount`` names
    them: ``pid 812 (less: events/000000000001 open)``, by their cwd, root and open files
    (``/proc/<pid>/cwd``, ``root`` and ``fd/*``: links the kernel resolves without asking
    the mount); at most ``most`` named, then how many more.  Empty if none is seen."""
    prefix = path.rstrip("/") + "/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        where = None
        try:
            links = [os.path.join("/proc", name, k) for k in ("cwd", "root")]
            fd_dir = os.path.join("/proc", name, "fd")
            links += [os.path.join(fd_dir, fd) for fd in os.listdir(fd_dir)]
            for link in links:
                target = os.readlink(link)
                if target == path or target.startswith(prefix):
                    rel, kind = os.path.relpath(target, path), os.path.basename(link)
                    where = (f"working directory {rel}" if kind == "cwd" else
                             f"root {rel}" if kind == "root" else f"{rel} open")
                    break
            if where is None:
                continue
            with open(os.path.join("/proc", name, "comm")) as f:
                comm = f.read().strip()
        except OSError:  # gone, or not ours to read
            continue
        found.append(f"pid {name} ({comm}: {where})")
    more = f" and {len(found) - most} more" if len(found) > most else ""
    return ", ".join(found[:most]) + more


def add_index_arguments(parser: argparse.ArgumentParser) -> None:
    """``--index-dir DIR`` and ``--no-index-cache`` for a subcommand that opens logs;
    :func:`main` applies them (:func:`apply_index_arguments`) before the command runs."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--index-dir", metavar="DIR",
                   help="keep persisted offset indexes in DIR (created 0700; default "
                        "$BOOKFS_CACHE_DIR, else the user cache, ~/.cache/bookfs/index)")
    g.add_argument("--no-index-cache", action="store_true",
                   help="never read or write a persisted index (read-only media, "
                        "throwaway runs): each open scans the log")


def apply_index_arguments(args) -> None:
    """Configure the index cache from ``--index-dir`` / ``--no-index-cache``; an index
    directory that cannot be created or is not private raises :class:`UsageError`."""
    from bookfs.errors import BookError
    from bookfs.formats import index
    from bookfs.formats.fileio import private_dir

    if getattr(args, "no_index_cache", False):
        index.configure_cache(None, enabled=False)
    elif getattr(args, "index_dir", None):
        path = os.path.abspath(os.path.expanduser(args.index_dir))
        try:
            private_dir(path, "index directory")
        except OSError as e:
            raise cliargs.UsageError(f"--index-dir {path}: {e.strerror}; expected a directory "
                             "bookfs can create or write") from None
        except BookError as e:
            raise cliargs.UsageError(f"--index-dir {e}") from None
        index.configure_cache(path)


def build_parser() -> argparse.ArgumentParser:
    p = cliargs.Parser(
        prog="bookfs",
        description="Urbit event logs (the Book format) as a filesystem.",
    )
    p.add_argument("--version", action="version", version=f"bookfs {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from bookfs.fs.daemon.mount import LOG_KEEP, options_help

    s = sub.add_parser("mount", help="mount a log", description=(
        "Mount SOURCE at MOUNTPOINT: events/<N> read-only, meta/<key>, new/ to append, "
        "info, segments/ (bulk view).  SOURCE is a pier (epochs under .urb/log/0iN/, shown "
        "under epochs/), a Book directory (book.log + meta.bin, UIP or vere layout) or an "
        "LMDB epoch.  Read-write by default (takes the writer lock: book.lock, or a pier's "
        ".vere.lock); -o ro for a read-only mount that follows appends.  A source whose "
        "newest epoch is LMDB is mounted read-only.  `bookfs SOURCE MOUNTPOINT -o OPTS` "
        "(mount.fuse3's calling form, used by `mount -t fuse.bookfs` and fstab) means the "
        "same.  With --fleet, SOURCE is a directory holding one pier (or Book directory, "
        "or LMDB epoch) per ship, all served read-only by one daemon as MOUNTPOINT/<ship>/ "
        "(the @p from each log's meta, else the directory's name), each with a single "
        "mount's layout; logs are opened on first use and closed when idle, piers added "
        "or removed appear or disappear within seconds, and one that cannot be opened "
        "shows as a file MOUNTPOINT/<name> saying why (docs/cluster.md)."),
        epilog=options_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("source")
    s.add_argument("mountpoint")
    s.add_argument("--fleet", action="store_true",
                   help="SOURCE is a directory of piers, one per ship: mount them all "
                        "read-only as MOUNTPOINT/<ship>/ with one daemon")
    s.add_argument("--max-open", type=cliargs.count(1), default=64, metavar="N",
                   help="--fleet: logs open at once (default 64; the least recently "
                        "used idle one is closed to open another)")
    s.add_argument("--idle-close", type=float, default=30.0, metavar="SECONDS",
                   help="--fleet: close a log unused for this long (default 30)")
    s.add_argument("--ships-ahead", type=cliargs.count(0), default=64, metavar="N",
                   help="--fleet: once a walk (find, du, ls -R) opens ships in listing "
                        "order, build the cards of up to N ships ahead of it in "
                        "background processes, one per CPU (default 64; 0: off)")
    s.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground, log to stderr (Ctrl-C unmounts)")
    s.add_argument("-o", dest="options", metavar="OPTS", action=_JoinOptions,
                   help="comma-separated mount options (listed below); may be repeated")
    s.add_argument("--debug", action="store_true", help="log every request")
    s.add_argument("--log-file", help="daemon log file (default: a new file in "
                   "$BOOKFS_LOG_DIR, else the user log directory, ~/.local/state/bookfs/log "
                   f"on Linux; the newest {LOG_KEEP} are kept)")
    add_index_arguments(s)
    s.set_defaults(func=cmd_mount)

    s = sub.add_parser("umount", help="unmount a bookfs mount", description=(
        "Unmount MOUNTPOINT and wait for its daemon to finish (index saved, writer lock "
        "released).  Refused while a process has a file open or its cwd inside, unless "
        "-l."))
    s.add_argument("mountpoint")
    s.add_argument("-l", "-z", "--lazy", action="store_true", dest="lazy",
                   help="detach now even if busy (like umount -l, fusermount3 -u -z); the "
                        "daemon finishes once the last open file inside is closed")
    s.set_defaults(func=cmd_umount)

    s = sub.add_parser("info", help="summarise a log", description=(
        "Format, first/last event, count, bytes, ship (@p), fake, life, version.  On a "
        "fleet mount (mount --fleet): its ships, events and bytes, and each ship's "
        "events, bytes and newest event."))
    s.add_argument("path", type=cliargs.log_source,
                   help="a pier, a Book directory, an LMDB epoch, a bookfs mount of one, "
                        "or a fleet mount")
    s.add_argument("--json", action="store_true", help="print JSON")
    add_index_arguments(s)
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("verify", help="check every event of a log", description=(
        "Read the whole log (a Book directory in either layout, an LMDB epoch or a pier) and "
        "check every event as its format allows: the UIP layout's CRCs; vere's framing and "
        "newest batch CRC; LMDB reads.  --nouns also decodes every event (a jam that cues "
        "completely and exactly, or vere's ram encoding) and lists each one that does not, "
        "with the byte of its payload where parsing failed; nothing is repaired.  --mugs "
        "is accepted as --nouns: a stored mug is the mug of Arvo's state after the event, "
        "which only a replay of the ship can check.  Exit 1 on any failure."))
    s.add_argument("path", type=cliargs.log_source,
                   help="a pier, a Book directory, an LMDB epoch, or a bookfs mount of one")
    s.add_argument("--nouns", action="store_true",
                   help="also decode every event and list each that does not decode")
    s.add_argument("--mugs", action="store_true",
                   help="the same as --nouns (a stored mug cannot be checked without "
                        "replaying the ship)")
    add_index_arguments(s)
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("sample", help="write a deterministic sample log", description=(
        "Write a log that looks like a real ship's: lifecycle boot events, then jammed "
        "[date ovum] events with realistic wires and cards and a heavy-tailed size mix.  "
        "Deterministic in --events and --seed: run again after an interruption (Ctrl-C) "
        "and it checks the events written so far and resumes."))
    s.add_argument("dir", type=cliargs.dir_to_create,
                   help="a new or empty directory, or one an interrupted run left (resumed)")
    s.add_argument("--events", type=cliargs.count(1), default=DEFAULT_SAMPLE_EVENTS,
                   help=f"how many events (default {DEFAULT_SAMPLE_EVENTS:,})")
    s.add_argument("--seed", type=cliargs.count(0), default=0,
                   help="random seed (default 0)")
    s.add_argument("--force", action="store_true",
                   help="replace a different sample log in DIR (only one bookfs sample "
                        "wrote)")
    s.set_defaults(func=cmd_sample)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return p


#: Subcommands added by other modules: callables taking the subparsers object.
_EXTRA_COMMANDS: list = []


#: The subcommands other modules add, by name: each module is loaded only for its own
#: command (or when the command line names none of them: ``--help``, a typo, a global
#: option's value first), so that ``bookfs umount`` does not load Spark, say.
OPTIONAL_COMMANDS = {"fsck": "bookfs.cli.fsck", "migrate": "bookfs.cli.migrate",
                     "spark": "bookfs.spark.cli", "show": "bookfs.cli.show",
                     "report": "bookfs.cli.report", "top": "bookfs.cli.top",
                     "append": "bookfs.cli.append"}
#: Modules that add lines to ``info`` (``rows:``, the Spark row builder in use), and the
#: commands that show an ``info``: ``bookfs info`` and a mount's ``info`` file.
INFO_FIELD_MODULES = ("bookfs.spark.rows",)
_INFO_COMMANDS = ("info", "mount")
_CORE_COMMANDS = ("mount", "umount", "info", "verify", "sample")


def preload(argv: list[str] | None = None) -> None:
    """Load every module :func:`main` needs before the subcommand itself runs: the
    subcommands' (:func:`_register_optional`), those their parsers import as they are
    built (help texts), and those that :func:`main`, :func:`apply_index_arguments` and
    the arguments' checks (``cli/args.py``) import when called.  ``bookfs.cli.main``
    calls it while it holds a Ctrl-C: one that comes during an import can be swallowed
    there (Python prints it as ignored and goes on), so no import is left for the
    moments between that and the subcommand's own answer."""
    import bookfs.errors  # noqa: F401
    import bookfs.formats.fileio  # noqa: F401
    import bookfs.formats.fleet  # noqa: F401
    import bookfs.formats.index  # noqa: F401
    import bookfs.fs.daemon.mount  # noqa: F401
    import bookfs.fs.daemon.mountinfo  # noqa: F401

    _register_optional(argv)
    build_parser()


def _register_optional(argv: list[str] | None = None) -> None:
    """Load the modules the command line ``argv`` needs (every one when ``argv`` is None
    or names no known command first): their subcommands (``register``) and their lines
    of ``info`` (``info_fields``)."""
    import importlib

    first = next((a for a in argv if not a.startswith("-")), None) if argv is not None \
        else None
    if first in OPTIONAL_COMMANDS:
        names = [OPTIONAL_COMMANDS[first]]
    elif first in _CORE_COMMANDS:
        names = list(INFO_FIELD_MODULES) if first in _INFO_COMMANDS else []
    else:
        names = [*OPTIONAL_COMMANDS.values(), *INFO_FIELD_MODULES]
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        register = getattr(module, "register", None)
        if register is not None and register not in _EXTRA_COMMANDS:
            _EXTRA_COMMANDS.append(register)
        fields = getattr(module, "info_fields", None)
        if fields is not None:  # lines of info (the Spark row builder)
            from bookfs.formats.info import add_fields

            add_fields(fields)


class _JoinOptions(argparse.Action):
    """``-o A -o B`` is ``-o A,B`` (mount(8) and mount.fuse pass one ``-o``; people
    sometimes write several)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{before},{values}" if before else values)


def mount_calling_form(argv: list[str], commands) -> list[str]:
    """``argv`` with ``mount`` put in front when it is mount.fuse3's calling form,
    ``SOURCE MOUNTPOINT [-o OPTS]...``: mount(8) runs ``/sbin/mount.fuse3`` for type
    ``fuse.bookfs``, which runs ``bookfs SOURCE MOUNTPOINT -o OPTS`` through /bin/sh.
    That is, when the first argument is neither an option nor a subcommand name and is a
    path (it exists or has a ``/``; a source named like a subcommand is written
    ``./info``), so a mistyped subcommand still gets argparse's "invalid choice"."""
    first = argv[0] if argv else ""
    if (first and not first.startswith("-") and first not in commands
            and (os.sep in first or os.path.exists(first))):
        return ["mount", *argv]
    return argv


def main(argv: list[str] | None = None) -> int:
    """Run the ``bookfs`` command; returns its exit status.  Expected errors become one
    line (see the module docstring); anything else propagates with its traceback."""
    from bookfs.errors import BookError
    from bookfs.fs.daemon.mount import MountError, OptionError

    argv = sys.argv[1:] if argv is None else list(argv)
    _register_optional(argv)
    parser = build_parser()
    commands = next(a.choices for a in parser._actions
                    if isinstance(a, argparse._SubParsersAction))
    argv = mount_calling_form(argv, commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="bookfs: %(message)s")
    say = f"bookfs {args.command}:"
    try:
        apply_index_arguments(args)
        return args.func(args)
    except (cliargs.UsageError, OptionError) as e:
        print(f"{say} {e}", file=sys.stderr)
        return cliargs.EXIT_USAGE
    except (BookError, MountError) as e:
        print(f"{say} {e}", file=sys.stderr)
        return cliargs.EXIT_FAILED
    except OSError as e:
        if e.filename is None:  # not about a path the user named: a bug or worse
            raise
        where = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
        print(f"{say} {where}: {e.strerror or e}", file=sys.stderr)
        return cliargs.EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{say} interrupted", file=sys.stderr)
        return cliargs.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
