"""The ENABLE_XLKV flag (and every other on/off variable of the shim), parsed in one place.
Standard library only: vLLM's plugin loader imports this with the flag off.

``xlkv_autopatch.pth`` and the checkout's ``sitecustomize.py`` cannot import it (they must
import nothing while the flag is off); tests/activation checks that their literal gates
agree with :data:`FALSY`.
"""

import os

FLAG = "ENABLE_XLKV"
TRUTHY = ("1", "true", "yes", "on")
FALSY = ("", "0", "false", "no", "off")


def truthy(value):
    """True for 1/true/yes/on (case-insensitive, surrounding blanks ignored)."""
    return (value or "").strip().lower() in TRUTHY


def flag_state(environ=None, name=FLAG):
    """``"on"``, ``"off"`` or ``"invalid"`` for the flag's value in ``environ``."""
    value = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if value in TRUTHY:
        return "on"
    if value in FALSY:
        return "off"
    return "invalid"


def flag_on(environ=None):
    return flag_state(environ) == "on"


def invalid_flag_message(environ=None):
    value = (os.environ if environ is None else environ).get(FLAG)
    return ("xlkv_autopatch: %s=%r is not a value xlkv understands, so it is neither on nor off. Fix: set %s=true "
            "(one of %s) to use the cross-layer KV layout, or unset it (or one of %s) for stock vLLM, on prefill and "
            "decode alike" % (FLAG, value, FLAG, "/".join(TRUTHY), "/".join(repr(v) for v in FALSY)))
