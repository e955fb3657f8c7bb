"""Argument checking for the ``bookfs`` command line, shared by every subcommand.

Bad arguments are refused before any work starts and before anything is created, as ONE
line on stderr and exit status 2:

* argparse ``type=`` functions here (:func:`count`, :func:`existing_dir`,
  :func:`dir_to_create`, :func:`file_to_write`, ...) raise ``ArgumentTypeError``, which
  :class:`Parser` prints as ``bookfs CMD: argument X: <what was expected>``;
* checks that need several arguments together (``--since`` after ``--until``, ...) raise
  :class:`bookfs.errors.UsageError`, which ``bookfs.cli.main`` prints as ``bookfs CMD: <message>``.

An operation that was well asked for but failed (a log that does not open, a disk error)
is not a usage error: it exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys

from bookfs.errors import UsageError  # noqa: F401  (raised by commands; exit 2)

#: Exit status for bad usage (argparse's own choice too).
EXIT_USAGE = 2
#: Exit status for an operation that failed.
EXIT_FAILED = 1
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``bookfs CMD: message (see bookfs
    CMD --help)``) and exit status 2, instead of a usage block plus a message.  Subparsers
    made from it are of this class too."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _int(text: str) -> int:
    try:
        return int(text.replace("_", "").replace(",", ""), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def count(minimum: int):
    """A ``type=`` for a whole number ``>= minimum`` (``1_000`` and ``1,000`` allowed)."""

    def parse(text: str) -> int:
        n = _int(text)
        if n < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number >= {minimum}, got {text!r}")
        return n

    parse.__name__ = f"count>={minimum}"
    return parse


#: An event number: 1 or more.
event_number = count(1)


def _what(path: str) -> str:
    """What is at ``path``, in words (for 'expected X, found Y' messages)."""
    if not os.path.lexists(path):
        return "nothing (no such file or directory)"
    if os.path.isdir(path):
        return "a directory"
    if os.path.isfile(path):
        return "a regular file"
    return "a special file"


def existing_dir(text: str) -> str:
    """A ``type=`` for a directory that exists and can be listed (a log, a mount)."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a directory, found {_what(text)} at "
                                         f"{text}")
    if not os.access(text, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: permission denied (expected a directory "
                                         "this user can read)")
    return text


def log_source(text: str) -> str:
    """A ``type=`` for the log a tool reads: a pier, a Book directory or an LMDB epoch, as
    :func:`existing_dir`; or a bookfs mount point, taken as the source it serves (one line
    on stderr says so), so that every tool accepts what ``show`` and ``report`` accept.  A
    mount whose ``fsname=`` hides its source is refused in one line."""
    existing_dir(text)
    from bookfs.formats.fleet import FLEET_MARKER
    from bookfs.fs.daemon.mountinfo import mount_at

    if os.path.isfile(os.path.join(text, FLEET_MARKER)):
        return text  # a fleet mount: `info` summarises it; the other tools refuse it
    parent = os.path.dirname(os.path.abspath(text))
    if os.path.isfile(os.path.join(parent, FLEET_MARKER)):  # MNT/<ship> of a fleet
        from bookfs.formats.info import parse

        try:
            with open(os.path.join(text, "info")) as f:
                source = parse(f.read())["path"]
        except (OSError, KeyError) as e:
            raise argparse.ArgumentTypeError(f"{text}: a ship of a fleet mount that cannot "
                                             f"be read ({e})") from None
        print(f"bookfs: {text} is a ship of a fleet mount: reading {source}",
              file=sys.stderr)
        return source
    m = mount_at(text)
    if m is None or not m.is_bookfs:
        return text
    source = m.bookfs_source
    if not source or not os.path.isdir(source):
        raise argparse.ArgumentTypeError(
            f"{text} is a bookfs mount whose source is not known (mounted with fsname=); "
            "expected the pier, Book directory or LMDB epoch itself")
    print(f"bookfs: {text} is a bookfs mount ({'read-only' if m.readonly else 'read-write'}) "
          f"of {source}: reading {source}", file=sys.stderr)
    return source


def dir_to_create(text: str) -> str:
    """A ``type=`` for a directory that may exist or will be created: not a file, and its
    parent directory must exist (nothing is created with ``mkdir -p``)."""
    if os.path.lexists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a directory (existing or new), found "
                                         f"{_what(text)} at {text}")
    _parent_exists(text)
    return text


def file_to_write(text: str) -> str:
    """A ``type=`` for a file to (over)write: not a directory, in an existing directory."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a file name to write, found a directory "
                                         f"at {text}")
    _parent_exists(text)
    return text


def _parent_exists(text: str) -> None:
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"{text}: its parent directory {parent} does not "
                                         "exist (create it first)")


def fail(command: str, message: str) -> None:
    """Print ``bookfs COMMAND: message`` on stderr (one line)."""
    print(f"bookfs {command}: {message}", file=sys.stderr, flush=True)
