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


def _chain():
    """Import the sitecustomize this file shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.get(__name__)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        nxt = importlib.import_module("sitecustomize")
        sys.modules["xlkv_autopatch_chained_sitecustomize"] = nxt
    except ImportError:
        pass
    except Exception as e:
        sys.stderr.write("xlkv_autopatch: chained sitecustomize failed (%s: %s)\n" % (type(e).__name__, e))
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules["sitecustomize"] = me


_activate()
_chain()
