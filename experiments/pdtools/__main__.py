"""``python3 experiments/pdtools <cmd> ...`` (or ``python3 -m pdtools`` with experiments/ on the path)."""

import os
import sys

if __package__ in (None, ""):
    # run as a folder: sys.path[0] is this folder; import the package from its parent instead
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.path.dirname(here))
    from pdtools.cli import main
else:
    from .cli import main

sys.exit(main())
