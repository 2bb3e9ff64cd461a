"""Every on/off environment variable of the shim (its *knobs*), parsed by one function.
Standard library only: vLLM's plugin loader imports this with the flag off.

===============  =======  ================================================================
knob             default  what "on" means
===============  =======  ================================================================
ENABLE_XLKV      off      the cross-layer KV layout (set it on prefill and decode alike)
XLKV_COALESCE    on       a cross-layer worker lists each NIXL transfer's descriptor pairs
                          in ascending local block order (patches/transfer_order.py)
XLKV_STRICT      off      a configuration that keeps the stock layout is an error, not a
                          WARNING
XLKV_EQUAL_TP    off      every peer runs this engine's tensor-parallel size: vLLM 0.12-0.28
                          keep cross-layer blocks that cannot be sliced by KV heads (a peer at
                          another TP size is then refused); off, such an engine keeps the
                          stock layout so that every TP pairing is served
XLKV_DETOK_TAIL  off      the API server decodes each request's first token against the
                          prompt's last 64 token ids, not the whole prompt (vLLM 0.17+; the
                          same text: patches/incremental_detokenizer.py); needs ENABLE_XLKV
===============  =======  ================================================================

Each knob accepts 1/true/yes/on, 0/false/no/off (case-insensitive, blanks around ignored),
or unset/empty for its default.  Any other value is an error naming the knob, the value
and the accepted values: :func:`knob` raises it, :func:`knob_errors` lists it (status), and
with ENABLE_XLKV on vLLM refuses to start (``_startup.activate``).

Knobs of earlier versions (:data:`REMOVED`) are no knobs: whatever their value they change
nothing, and a deployment that still sets one is told so (a WARNING at activation, a NOTE in
status), not refused.

``xlkv_autopatch.pth`` and the checkout's ``sitecustomize.py`` cannot import this module
(they must import nothing while the flag is off); tests/activation checks that their
literal gates agree with :data:`FALSY`.
"""

import os
from collections import namedtuple

FLAG = "ENABLE_XLKV"
TRUTHY = ("1", "true", "yes", "on")
#: ENABLE_XLKV's off values ("": set but blank, the default); the .pth gate's literal tuple
FALSY = ("", "0", "false", "no", "off")

Knob = namedtuple("Knob", "name default meaning fix")

KNOBS = (
    Knob(FLAG, False, "the cross-layer KV layout",
         "set ENABLE_XLKV=true to use the cross-layer KV layout, or unset it for stock vLLM, on prefill and decode "
         "alike."),
    Knob("XLKV_COALESCE", True, "NIXL descriptor pairs in ascending local block order",
         "unset XLKV_COALESCE (default: on), or set XLKV_COALESCE=false to keep vLLM's descriptor order."),
    Knob("XLKV_STRICT", False, "a kept stock layout is an error instead of a WARNING",
         "set XLKV_STRICT=1 to make a kept stock layout an error, or unset it for a WARNING."),
    Knob("XLKV_EQUAL_TP", False, "cross-layer blocks that serve equal TP sizes only (vLLM 0.12-0.28)",
         "set XLKV_EQUAL_TP=true where every peer runs this engine's tensor-parallel size, or unset it so that "
         "any prefill/decode TP pairing is served."),
    Knob("XLKV_DETOK_TAIL", False, "the first token decoded against the prompt's last 64 ids (vLLM 0.17+)",
         "set XLKV_DETOK_TAIL=true to decode each request's first token against the prompt's last 64 token ids, "
         "or unset it for vLLM's whole-prompt priming."),
)
_BY_NAME = {k.name: k for k in KNOBS}

#: the knobs that turn on a *switch*: a patch set registered only while its knob is on
#: (``PatchGroup.knob``; tests/unit/test_registry.py checks this list against the patch sets).
#: experiments/upstream runs vLLM's own NIXL tests with all of them on (its ``switches`` mode).
SWITCHES = ("XLKV_DETOK_TAIL",)

#: knobs of earlier versions that do nothing now: name -> (the version that removed it, why).  A
#: deployment that still sets one is told so (a WARNING once per process at activation, a NOTE in
#: status), never refused: whatever its value, the run is the one it would be without it.
REMOVED = {
    "XLKV_EARLY_LOAD": ("0.4.0", "the handoff lever that posted decode's KV reads before the forward launch: with it "
                                 "on, vLLM's own NIXL tests differed from stock on a GPU (a failed transfer no longer "
                                 "reported as vLLM reports it) and it showed no TTFT gain"),
    "XLKV_NOTICE_WAIT": ("0.4.0", "the handoff lever that waited up to 5 ms per step for KV reads in flight: with it "
                                  "on, a failed NIXL read escaped vLLM's error handling and vLLM's own NIXL tests "
                                  "differed from stock on a GPU, and it showed no TTFT gain"),
}


def removed_knob_notes(environ=None):
    """One sentence per removed knob (:data:`REMOVED`) that is set to anything non-empty."""
    env = os.environ if environ is None else environ
    return ["%s=%r: %s was removed in xlkv_autopatch %s (%s); it has no effect. Fix: unset %s"
            % (name, env.get(name), name, version, why, name)
            for name, (version, why) in REMOVED.items() if (env.get(name) or "").strip()]


def accepted(name):
    """The accepted values of knob ``name``, as the error messages and status print them."""
    return "%s (on), %s (off), or unset/empty (default: %s)" % (
        "/".join(TRUTHY), "/".join(v for v in FALSY if v), "on" if _BY_NAME[name].default else "off")


def knob_state(name, environ=None):
    """``"on"``, ``"off"`` or ``"invalid"`` for knob ``name`` in ``environ`` (default: os.environ)."""
    value = (os.environ if environ is None else environ).get(name)
    value = (value or "").strip().lower()
    if not value:
        return "on" if _BY_NAME[name].default else "off"
    if value in TRUTHY:
        return "on"
    if value in FALSY:
        return "off"
    return "invalid"


def knob_error(name, environ=None):
    """The error sentence for knob ``name``'s value, or None when it is recognised."""
    if knob_state(name, environ) != "invalid":
        return None
    value = (os.environ if environ is None else environ).get(name)
    return ("xlkv_autopatch: %s=%r is not a value xlkv understands, so it is neither on nor off (accepted: %s). "
            "Fix: %s" % (name, value, accepted(name), _BY_NAME[name].fix))


def knob_errors(environ=None):
    """Error sentences for every knob whose value is not recognised, ENABLE_XLKV first."""
    return [e for e in (knob_error(k.name, environ) for k in KNOBS) if e]


def knob(name, environ=None):
    """True/False for knob ``name``; an unrecognised value raises XlkvFlagError naming it."""
    state = knob_state(name, environ)
    if state == "invalid":
        from .errors import XlkvFlagError  # only on the error path: the flag-off import set stays as it is

        raise XlkvFlagError(knob_error(name, environ))
    return state == "on"


def flag_state(environ=None, name=FLAG):
    """``"on"``, ``"off"`` or ``"invalid"`` for ENABLE_XLKV (or the knob ``name``)."""
    return knob_state(name, environ)


def flag_on(environ=None):
    return flag_state(environ) == "on"


def invalid_flag_message(environ=None):
    return knob_error(FLAG, environ)


def truthy(value):
    """True for 1/true/yes/on.  Only for *other* projects' variables (kvcached's
    ENABLE_KVCACHED/KVCACHED_AUTOPATCH), whose parsing is theirs; xlkv's own knobs go
    through :func:`knob`."""
    return (value or "").strip().lower() in TRUTHY
