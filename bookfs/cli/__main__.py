"""``python -m bookfs.cli``: the ``bookfs`` command."""
import sys

from bookfs.cli.commands import main

sys.exit(main())
