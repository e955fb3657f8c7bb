"""``python -m bookfs.cli``: the ``bookfs`` command."""
import sys

from bookfs.cli import main

sys.exit(main())
