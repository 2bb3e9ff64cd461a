"""The one logger of the package, and once-per-process messages.  Standard library only.

The logger is a child of vLLM's (``vllm.xlkv_autopatch``), so lines appear in vLLM's
format and at its level.
"""

import logging
import threading

logger = logging.getLogger("vllm.xlkv_autopatch")

_lock = threading.Lock()
_seen = set()


def once(key):
    """True the first time ``key`` is seen in this process."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
        return True


def info_once(key, msg, *args):
    if once(("info", key)):
        logger.info("xlkv_autopatch: " + msg, *args)

