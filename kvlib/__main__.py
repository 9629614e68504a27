"""``python -m kvlib``: the command line of :mod:`kvlib.tools.cli` (the ``kvlib`` script calls the same ``main``)."""
import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
