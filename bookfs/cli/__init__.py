"""The ``bookfs`` command and its tools; each reads a log through :mod:`bookfs.formats`.

``commands``  the entry point: mount, umount, info, verify, sample, and the tools below
``args``      argument checks shared by every subcommand (one-line errors, exit 2)
``append``    ``bookfs append``: files as events through ``new/``
``show``      ``bookfs show``: events as readable nouns
``report``    ``bookfs report``: charts and an index.html in one streaming pass
``report_stats`` the classic report's pass and charts
``report_by`` ``bookfs report --by KEY``: what fills a log, as a table, JSON or a page
``breakdown`` events grouped by a key: bytes, share, growth, biggest event
``breakdown_html`` the page of ``report --by KEY --out DIR``
``heads``     every event's head, from any source, fast (what ``--by`` and ``top`` group by)
``top``       ``bookfs top``: what is being appended right now
``fleetinfo`` ``bookfs info`` on a fleet mount
``fsck``      ``bookfs fsck``: each format's Recovery (check, repair, salvage)
``migrate``   ``bookfs migrate``: one pier's log into another layout
``sample``    deterministic, realistic sample logs

(``bookfs spark`` lives with the rest of Spark, in :mod:`bookfs.spark.cli`.)
"""


def main(argv=None) -> int:
    """``bookfs`` (the console script ``bookfs.cli:main``; ``python -m bookfs.cli``).

    A Ctrl-C while the command starts is one line, ``bookfs: interrupted``, and exit
    status 130, never a traceback; each subcommand answers the ones that come later.
    While the command's modules load, a Ctrl-C is held until they have: raised in an
    import, a KeyboardInterrupt can be lost (Python only prints one raised in a weakref
    callback, such as importlib's ``_get_module_lock``) or end the process by SIGINT
    after it was caught (``Python/pythonrun.c``, ``run_eval_code_obj()``, marks one that
    leaves the ``exec`` of a string, as ``dataclasses`` and ``namedtuple`` do, as never
    caught).  Before this function runs (Python's own start-up, ``import bookfs``), a
    Ctrl-C is Python's."""
    import _signal  # loaded with the interpreter: importing ``signal`` takes milliseconds
    import sys

    held: list[int] = []
    before = _signal.signal(_signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        from bookfs.cli.commands import main as _main
        from bookfs.cli.commands import preload

        preload(sys.argv[1:] if argv is None else list(argv))  # what main would import
    finally:
        _signal.signal(_signal.SIGINT, before)
    try:
        if held:
            raise KeyboardInterrupt
        return _main(argv)
    except KeyboardInterrupt:
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a second one: the same line
        print("bookfs: interrupted", file=sys.stderr)
        return 130
