"""``python -m kvlib``: the command line of :mod:`kvlib.tools.cli`."""
import sys

from .tools.cli import main

sys.exit(main())
