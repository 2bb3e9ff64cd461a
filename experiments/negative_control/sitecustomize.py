"""Negative-control start-up hook (EXPERIMENTS ONLY; see xlkv_negative_control.py).

Put this folder first on the PYTHONPATH of the decode server only, with
XLKV_NEGATIVE_CONTROL=shift (or swap-layers): every process of that server (API server,
engine core, workers) then corrupts the KV it receives over NIXL.  Python imports only the
first ``sitecustomize`` on sys.path, so this one then imports the next (the checkout's, which
turns the shim on where ENABLE_XLKV is set, or the environment's own).

The same hook writes D's registration report when XLKV_REGISTRATION_REPORT=<path> is set (lib.sh
puts this folder on D's PYTHONPATH for every config then, stock too): it only reads the worker
after vLLM's register_kv_caches returned; nothing is corrupted unless XLKV_NEGATIVE_CONTROL is set.
"""

import os
import sys

#: lets a (fake) server or a test see that this hook was loaded
XLKV_NEGATIVE_CONTROL_HOOK = True


def _arm():
    try:
        import xlkv_negative_control

        xlkv_negative_control.install()
    except Exception as e:  # a broken control must not pass silently: say it loudly
        sys.stderr.write("xlkv negative control: FAILED to arm (%s: %s)\n" % (type(e).__name__, e))


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
        sys.modules["xlkv_negative_control_chained_sitecustomize"] = nxt
    except ImportError:
        pass
    except Exception as e:
        sys.stderr.write("xlkv negative control: chained sitecustomize failed (%s: %s)\n" % (type(e).__name__, e))
    finally:
        sys.path[:] = saved
        if me is not None:
            sys.modules["sitecustomize"] = me


_arm()
_chain()
