"""Negative-control start-up hook (EXPERIMENTS ONLY; see xlkv_negative_control.py).

Put this folder first on the PYTHONPATH of the decode server only, with
XLKV_NEGATIVE_CONTROL=shift (or swap-layers): every process of that server (API server,
engine core, workers) then corrupts the KV it receives over NIXL.  Python imports only the
first ``sitecustomize`` on sys.path, so this one then imports the next (the checkout's, which
turns the shim on where ENABLE_XLKV is set, or the environment's own).

The same hook writes D's registration report when XLKV_REGISTRATION_REPORT=<path> is set (the lab,
pdtools/pair.py, puts this folder on D's PYTHONPATH for every config then, stock too): it only reads the worker
after vLLM's register_kv_caches returned; nothing is corrupted unless XLKV_NEGATIVE_CONTROL is set.

With XLKV_TRACE_HANDOFF=<folder> (pdtools/pair.py, HANDOFF_TRACE=1, on P and D) it also arms the handoff
trace (xlkv_handoff_trace.py): pass-through wrappers that write when each step of a request's P/D handoff
happened; nothing of vLLM's behaviour changes.  (The detokenizer lever this hook armed on 2026-11-27 as
XLKV_LAB_DETOK_TAIL is the shim's XLKV_DETOK_TAIL switch since xlkv_autopatch 0.9.1.)
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


def _arm_if(env, module, what):
    """Arm the lab hook ``module`` (its install()) where ``env`` is set; one that does not arm must be seen,
    not mistaken for a run without it."""
    if not os.environ.get(env):
        return
    try:
        __import__(module).install()
    except Exception as e:
        sys.stderr.write("xlkv %s: FAILED to arm (%s: %s)\n" % (what, type(e).__name__, e))


def _chain():
    """Import the sitecustomize this file shadows, through the checkout's own chain() (the
    checkout's sitecustomize.py, two folders up, loaded under another name so that it neither
    activates the shim nor chains here: the chained one does that where it is next on sys.path)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("xlkv_checkout_sitecustomize_chain",
                                                      os.path.join(root, "sitecustomize.py"))
        checkout = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(checkout)
    except Exception as e:  # say it: the shim's activation behind this hook would be skipped
        sys.stderr.write("xlkv negative control: cannot load the checkout's sitecustomize chain (%s: %s)\n"
                         % (type(e).__name__, e))
        return
    checkout.chain(__file__, "xlkv_negative_control_chained_sitecustomize", "xlkv negative control")


_arm()
_arm_if("XLKV_TRACE_HANDOFF", "xlkv_handoff_trace", "handoff trace")
_chain()
