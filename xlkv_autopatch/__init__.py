"""xlkv_autopatch: cross-layer KV-cache transfers for vLLM's NixlConnector, as import hooks.

This module is imported by the ``.pth`` start-up hook (only when ENABLE_XLKV is truthy)
and by vLLM's plugin loader, so it must stay import-light: no wrapt, no vLLM, no torch
here.  The public API loads the registry lazily.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "install", "uninstall", "status", "is_enabled"]


def is_enabled(environ=None):
    """True when ENABLE_XLKV is one of 1/true/yes/on (case-insensitive)."""
    from ._startup import flag_on

    return flag_on(environ)


def install(source="api"):
    """Register the post-import hooks that patch vLLM (idempotent)."""
    from . import registry

    return registry.install(source=source)


def uninstall():
    """Undo every patch this process applied, restoring the original attributes exactly."""
    from . import registry

    return registry.uninstall()


def status(resolve=True):
    """A dict describing the installed vLLM, the flag, the activation paths and the patches."""
    from . import report

    return report.collect(resolve=resolve)
