"""The ``bookfs`` command.  Every subcommand has ``--help``; errors are one line on stderr
and a non-zero exit status (1: the operation failed; 2: bad usage)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import __version__

DEFAULT_SAMPLE_EVENTS = 100_000


def _progress_bar(total: int, desc: str, unit: str = "B"):
    """A tqdm bar on stderr (silent when stderr is not a terminal and BOOKFS_PROGRESS is
    unset, so scripts and CI logs stay readable)."""
    from tqdm import tqdm

    disable = not sys.stderr.isatty() and not os.environ.get("BOOKFS_PROGRESS")
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, disable=disable,
                mininterval=0.5, leave=False)


def cmd_sample(args) -> int:
    from .book import Book
    from .sample import iter_sample_payloads, sample_meta

    path = args.dir
    if os.path.exists(os.path.join(path, "book.log")) and not args.force:
        print(f"bookfs sample: {path}/book.log exists; use --force to add nothing and "
              "keep it, or choose an empty directory", file=sys.stderr)
        return 1
    with Book.open(path, writable=True, create=True) as book:
        if book.count:
            print(f"bookfs sample: {path} already holds events {book.gulf()}; left as is",
                  file=sys.stderr)
            return 1
        for key, value in sample_meta(args.seed).items():
            book.save_meta(key, value)
        batch, first = [], 1
        batch_bytes = 0
        with _progress_bar(args.events, "sample", unit="ev") as bar:
            for payload in iter_sample_payloads(args.events, args.seed):
                batch.append(payload)
                batch_bytes += len(payload)
                if len(batch) >= 1000 or batch_bytes >= 16 << 20:
                    book.save(first, batch)
                    first += len(batch)
                    bar.update(len(batch))
                    batch, batch_bytes = [], 0
            if batch:
                book.save(first, batch)
                bar.update(len(batch))
        print(f"bookfs sample: wrote events {book.first}..{book.last} "
              f"({book.log_bytes:,} bytes) to {path}")
    return 0


def cmd_info(args) -> int:
    from .info import render, summary
    from .pier import open_source

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
    from .pier import open_source
    from .recovery import CheckReport, check_mugs

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
        mugs = None
        if args.mugs:
            mugs = CheckReport(log.directory, log.format)
            with _progress_bar(log.log_bytes, "mugs") as bar:
                check_mugs(log, mugs, progress=bar.update)
            for p in mugs.problems:
                print(f"mug mismatch: {p.message}")
        if bad or damaged or (mugs is not None and mugs.problems):
            return 1
        said = "; ".join(what.get(k, k) for k in kinds)
        if mugs is not None:
            said += (f"; {mugs.mugs_checked} mugs match their nouns"
                     f" ({mugs.mugs_unset} unset, mug 0)")
        print(f"{log.format}: {log.count} events, {log.log_bytes:,} bytes: {said}")
    return 0


def cmd_mount(args) -> int:
    from .fs.mount import mount

    opts = args.options
    return mount(args.source, args.mountpoint, options=opts, foreground=args.foreground,
                 debug=args.debug, log_file=args.log_file)


def cmd_umount(args) -> int:
    from .fs.mount import umount

    return umount(args.mountpoint)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bookfs",
        description="Urbit event logs (the Book format) as a filesystem.",
    )
    p.add_argument("--version", action="version", version=f"bookfs {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("mount", help="mount a log", description=(
        "Mount SOURCE at MOUNTPOINT: events/<N> read-only, meta/<key>, new/ to append, "
        "info, segments/ (bulk view).  SOURCE is a pier (epochs under .urb/log/0iN/, shown "
        "under epochs/), a Book directory (book.log + meta.bin, UIP or vere layout) or an "
        "LMDB epoch.  Read-write by default (takes the writer lock: book.lock, or a pier's "
        ".vere.lock); -o ro for a read-only mount that follows appends.  A source whose "
        "newest epoch is LMDB is mounted read-only."))
    s.add_argument("source")
    s.add_argument("mountpoint")
    s.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground, log to stderr (Ctrl-C unmounts)")
    s.add_argument("-o", dest="options", metavar="OPTS",
                   help="comma-separated: ro|rw, allow_other, stall_timeout=SECONDS "
                        "(how long a new/ writer waits for a stalled predecessor; 30), "
                        "segment_mb=MB (byte span of each segments/ file; 16)")
    s.add_argument("--debug", action="store_true", help="log every request")
    s.add_argument("--log-file", help="daemon log file (default /tmp/bookfs-<pid>.log)")
    s.set_defaults(func=cmd_mount)

    s = sub.add_parser("umount", help="unmount a bookfs mount",
                       description="Unmount MOUNTPOINT and wait for its daemon to finish.")
    s.add_argument("mountpoint")
    s.set_defaults(func=cmd_umount)

    s = sub.add_parser("info", help="summarise a log", description=(
        "Format, first/last event, count, bytes, ship (@p), fake, life, version."))
    s.add_argument("path", help="a pier, a Book directory or an LMDB epoch")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("verify", help="check every event of a log", description=(
        "Read the whole log (a Book directory in either layout, an LMDB epoch or a pier) and "
        "check every event as its format allows: the UIP layout's CRCs; vere's framing and "
        "newest batch CRC; LMDB reads.  --mugs also cues every event and compares its "
        "stored mug with the noun's mug (mug 0 is unset and skipped). Exit 1 on any "
        "failure."))
    s.add_argument("path", help="a pier, a Book directory or an LMDB epoch")
    s.add_argument("--mugs", action="store_true",
                   help="also check every event's mug against its cued jam")
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("sample", help="write a deterministic sample log", description=(
        "Write a log that looks like a real ship's: lifecycle boot events, then jammed "
        "[date ovum] events with realistic wires and cards and a heavy-tailed size mix."))
    s.add_argument("dir")
    s.add_argument("--events", type=int, default=DEFAULT_SAMPLE_EVENTS,
                   help=f"how many events (default {DEFAULT_SAMPLE_EVENTS:,})")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    s.add_argument("--force", action="store_true", help="allow an existing, empty log")
    s.set_defaults(func=cmd_sample)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return p


#: Subcommands added by other modules: callables taking the subparsers object.
_EXTRA_COMMANDS: list = []


def _register_optional() -> None:
    import importlib

    for name in ("fsck", "migrate", "spark_cli", "append"):
        try:
            module = importlib.import_module(f"bookfs.{name}")
        except ImportError:
            continue
        register = getattr(module, "register", None)
        if register is not None and register not in _EXTRA_COMMANDS:
            _EXTRA_COMMANDS.append(register)


def main(argv: list[str] | None = None) -> int:
    from .errors import BookError
    from .fs.mount import MountError

    _register_optional()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="bookfs: %(message)s")
    try:
        return args.func(args)
    except (BookError, MountError) as e:
        print(f"bookfs {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
