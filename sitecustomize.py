"""Activation for runs from a source checkout: ``PYTHONPATH=<repo> ENABLE_XLKV=true ...``.

Not shipped in the wheel (an installed ``sitecustomize`` would shadow the one of the
distribution or the virtual environment).  Python imports only the first
``sitecustomize`` on ``sys.path``, and ``PYTHONPATH`` comes first, so this file then
imports the next one (Debian's apport hook, a tracer's, ...) instead of hiding it.
"""

import os
import sys

#: lets ``python -m xlkv_autopatch status`` see this activation path
XLKV_AUTOPATCH_SITECUSTOMIZE = True


def _activate():
    if os.environ.get("ENABLE_XLKV", "").strip().lower() in ("", "0", "false", "no", "off"):
        return  # the flag is off: import nothing (an unrecognised value goes on, and activate() refuses it)
    try:
        from xlkv_autopatch._startup import start
    except Exception as e:  # nothing of the package can run, so nothing can refuse: say it runs stock
        if not getattr(sys, "_xlkv_autopatch_pth_ran", False):  # the .pth printed this error already
            sys.stderr.write("xlkv_autopatch: sitecustomize activation failed (%s: %s); this process runs STOCK "
                             "vLLM with ENABLE_XLKV set. Fix: put the checkout on PYTHONPATH whole, or unset "
                             "ENABLE_XLKV\n" % (type(e).__name__, e))
        return
    # as the .pth hook does: activate, or print the error once and refuse every import of vLLM with it
    start("sitecustomize")


def chain(this_file=__file__, alias="xlkv_autopatch_chained_sitecustomize", who="xlkv_autopatch"):
    """Import the sitecustomize that ``this_file`` (a sitecustomize.py being imported) shadows, if
    there is one, and keep it in sys.modules as ``alias``.  The lab's negative-control hook
    (experiments/negative_control/sitecustomize.py) chains through this function too."""
    here = os.path.dirname(os.path.abspath(this_file))
    me = sys.modules.get("sitecustomize")
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        nxt = importlib.import_module("sitecustomize")
        sys.modules[alias] = nxt
    except ImportError:
        pass
    except Exception as e:
        sys.stderr.write("%s: chained sitecustomize failed (%s: %s)\n" % (who, type(e).__name__, e))
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules["sitecustomize"] = me


if __name__ == "sitecustomize":  # not when another hook loads this file for chain()
    _activate()
    chain()
