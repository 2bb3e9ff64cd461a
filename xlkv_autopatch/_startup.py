"""Start-up entry points.  Standard library only.

Three triggers end in the same idempotent :func:`activate`:

* ``xlkv_autopatch.pth`` (site-packages, every interpreter start; it reads the flag
  itself and imports this module only when ENABLE_XLKV is set to something),
* the ``vllm.general_plugins`` entry point (:mod:`xlkv_autopatch.plugin`), which vLLM
  calls in the API server, the engine core and every worker,
* ``sitecustomize.py`` at the repository root, for runs from a source checkout.

This module, :mod:`xlkv_autopatch` (and its `_version`), :mod:`xlkv_autopatch.plugin` and
:mod:`xlkv_autopatch.flag` are what vLLM's plugin loader imports in every vLLM process
even with the flag off, so they import nothing outside the standard library
(tests/activation checks it).
"""

from .flag import flag_state, knob_errors


def activate(source):
    """Install the patches if ENABLE_XLKV is on.  Returns True when active.

    An unrecognised value of any knob (ENABLE_XLKV and the XLKV_* knobs; see
    :mod:`.flag`) raises here, before anything is patched (vLLM then refuses to start): a
    typo must not become a silent stock run, nor a refusal in every worker later.
    """
    if flag_state() == "off":
        return False
    from . import errors  # standard library only

    bad = knob_errors()
    if bad:
        raise errors.XlkvFlagError(" Also: ".join(bad))
    try:
        import wrapt  # noqa: F401  (the registry's post-import hooks)
    except ImportError as e:
        raise errors.XlkvDependencyError(
            "xlkv_autopatch: ENABLE_XLKV is set but its dependency wrapt cannot be imported (%s), so vLLM cannot be "
            "patched. Fix: pip install 'wrapt>=1.14' into this environment (xlkv_autopatch was probably installed "
            "with --no-deps), or unset ENABLE_XLKV" % e) from e
    from . import patches, registry

    registry.REGISTRY.install(source=source, groups_provider=patches.all_groups)
    return True
