"""The ``bookfs`` command and its tools; each reads a log through :mod:`bookfs.formats`.

``commands``  the entry point: mount, umount, info, verify, sample, and the tools below
``args``      argument checks shared by every subcommand (one-line errors, exit 2)
``append``    ``bookfs append``: files as events through ``new/``
``show``      ``bookfs show``: events as readable nouns
``report``    ``bookfs report``: charts and an index.html in one streaming pass
``fsck``      ``bookfs fsck``: each format's Recovery (check, repair, salvage)
``migrate``   ``bookfs migrate``: one pier's log into another layout
``sample``    deterministic, realistic sample logs

(``bookfs spark`` lives with the rest of Spark, in :mod:`bookfs.spark.cli`.)
"""


def main(argv=None) -> int:
    """``bookfs`` (the console script ``bookfs.cli:main``)."""
    from bookfs.cli.commands import main as _main

    return _main(argv)
