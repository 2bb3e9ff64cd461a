"""Start-up entry points.  Standard library only until the flag is known to be on.

Three triggers end in the same idempotent :func:`activate`:

* ``xlkv_autopatch.pth`` (site-packages, every interpreter start; it checks the flag
  itself and imports this module only when the flag is on),
* the ``vllm.general_plugins`` entry point (:mod:`xlkv_autopatch.plugin`), which vLLM
  calls in the API server, the engine core and every worker,
* ``sitecustomize.py`` at the repository root, for runs from a source checkout.
"""

import os

FLAG = "ENABLE_XLKV"
TRUTHY = ("1", "true", "yes", "on")


def flag_on(environ=None):
    env = os.environ if environ is None else environ
    return env.get(FLAG, "").strip().lower() in TRUTHY


def activate(source):
    """Install the patches if ENABLE_XLKV is on.  Returns True when active."""
    if not flag_on():
        return False
    from . import registry  # imports wrapt; only reached with the flag on

    registry.install(source=source)
    return True
