"""Start-up entry points.  Standard library only.

Three triggers end in the same idempotent :func:`activate`:

* ``xlkv_autopatch.pth`` (site-packages, every interpreter start; it reads the flag
  itself and imports this module only when ENABLE_XLKV is set to something),
* the ``vllm.general_plugins`` entry point (:mod:`xlkv_autopatch.plugin`), which vLLM
  calls in the API server, the engine core and every worker,
* ``sitecustomize.py`` at the repository root, for runs from a source checkout.

One behaviour whatever the path, when activation fails with ENABLE_XLKV set (an unrecognised
knob value, a missing wrapt, ...): vLLM refuses to start with the error, which names the cause
and the fix.  The plugin raises it inside vLLM's plugin loading; the two paths that run at
interpreter start-up (:func:`start`), which cannot stop the interpreter (site.py only prints
what they raise) and must not stop processes that never use vLLM (pip, status), print it once
on stderr and *arm* it (:func:`arm`): every later import of ``vllm`` in that process raises it.
Without the arming, a checkout run through ``sitecustomize.py`` alone (no plugin entry point),
or an install whose plugin ``VLLM_PLUGINS`` leaves out, ran stock vLLM with the flag on.

This module, :mod:`xlkv_autopatch` (and its `_version`), :mod:`xlkv_autopatch.plugin` and
:mod:`xlkv_autopatch.flag` are what vLLM's plugin loader imports in every vLLM process
even with the flag off, so they import nothing outside the standard library
(tests/activation checks it).
"""

import sys
import threading

from .flag import flag_state, knob_errors, removed_knob_notes

#: what :func:`start` says after the error, on stderr
ARMED = ("every import of vLLM in this process raises it, so vLLM refuses to start while ENABLE_XLKV is set "
         "(the vLLM plugin raises it too)")

_lock = threading.Lock()
_armed = None  # the _RefuseVllm finder in sys.meta_path, or None


def activate(source):
    """Install the patches if ENABLE_XLKV is on.  Returns True when active.

    An unrecognised value of any knob (ENABLE_XLKV and the XLKV_* knobs; see
    :mod:`.flag`) raises here, before anything is patched (vLLM then refuses to start): a
    typo must not become a silent stock run, nor a refusal in every worker later.  A knob an
    earlier version had (:data:`.flag.REMOVED`) is a WARNING, once per process.
    """
    if flag_state() == "off":
        return False
    from . import errors  # standard library only

    bad = knob_errors()
    if bad:
        raise errors.XlkvFlagError(" Also: ".join(bad))
    for name, pin in (("wrapt", "wrapt>=1.14"), ("packaging", "packaging>=21")):  # the registry's hooks, versions
        try:
            __import__(name)
        except ImportError as e:
            raise errors.XlkvDependencyError(
                "xlkv_autopatch: ENABLE_XLKV is set but its dependency %s cannot be imported (%s), so vLLM cannot be "
                "patched. Fix: pip install '%s' into this environment (%s), or unset ENABLE_XLKV"
                % (name, e, pin, _how_it_came(source))) from e
    from . import logs, patches, registry

    for note in removed_knob_notes():
        if logs.once(("removed", note)):
            logs.logger.warning("xlkv_autopatch: %s", note)
    registry.warn_inert_knobs()
    registry.REGISTRY.install(source=source, groups_provider=patches.all_groups)
    return True


def _how_it_came(source):
    """Why a dependency may be missing, by the activation path that ran."""
    if source == "sitecustomize":
        return ("this process activated xlkv from a source checkout's sitecustomize.py on PYTHONPATH, where "
                "nothing installed its dependencies; `pip install <checkout>` installs them with it")
    return "xlkv_autopatch was probably installed with --no-deps"


class _RefuseVllm:
    """A ``sys.meta_path`` finder that raises the start-up error at every import of vLLM."""

    def __init__(self, error, source):
        self.error = error
        self.source = source

    def refusal(self):
        from . import errors

        kind = type(self.error) if isinstance(self.error, errors.XlkvError) else errors.XlkvError
        text = str(self.error) if isinstance(self.error, errors.XlkvError) else (
            "xlkv_autopatch: activation failed (%s: %s) with ENABLE_XLKV set. Fix: reinstall xlkv_autopatch, or "
            "unset ENABLE_XLKV" % (type(self.error).__name__, self.error))
        return kind("%s [refused at the import of vLLM: the start-up hook (%s) failed with ENABLE_XLKV set]"
                    % (text, self.source))

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise self.refusal()
        return None


def arm(error, source):
    """Make every later import of vLLM in this process raise ``error`` (the first one armed wins).
    True when this call armed it."""
    global _armed
    with _lock:
        if _armed is not None:
            return False
        _armed = _RefuseVllm(error, source)
        sys.meta_path.insert(0, _armed)
        return True


def armed():
    """The refusal armed in this process (an exception), or None."""
    return None if _armed is None else _armed.refusal()


def disarm():
    """Lift the armed refusal (``status`` does, to look at vLLM anyway); returns it, or None."""
    global _armed
    with _lock:
        finder, _armed = _armed, None
        if finder is None:
            return None
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        return finder.refusal()


def start(source):
    """The interpreter start-up paths (the .pth hook, the checkout's sitecustomize.py): :func:`activate`;
    if it raises, print the error once and :func:`arm` it.  Never raises."""
    try:
        return activate(source)
    except Exception as e:  # noqa: BLE001 - whatever it is, the flag is on and the run must not be stock
        if arm(e, source):
            sys.stderr.write("xlkv_autopatch: start-up hook (%s) failed (%s: %s); %s\n"
                             % (source, type(e).__name__, e, ARMED))
        return False
