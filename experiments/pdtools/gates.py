"""The lab's release gates, read from the shim's release table (xlkv_autopatch/releases.py): what a
vLLM release has (its own cross-layer blocks, KV cache layouts, a Model Runner V2 default that ignores
cross-layer blocks), so that no version boundary is typed in the lab a second time.

    gate(NAME, VERSION) -> (True, "") or (False, why not)

Names: ``native`` (vLLM's own cross-layer setting exists: enable_cross_layers_blocks, later
VLLM_KV_CACHE_LAYOUT=BLNHC), ``layouts`` (KV cache layouts chosen once per engine:
VLLM_KV_CACHE_LAYOUT), ``runner-v1`` (Model Runner V2 is the default and ignores cross-layer blocks,
so the V1 runner must be asked for).  Standard library only; the table is imported from the
checkout this file lies in when the running Python has no xlkv_autopatch (loaded from its folder,
without a change to sys.path).
"""
import importlib
import importlib.util
import os
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shim(name):
    """The shim's pure module ``xlkv_autopatch.<name>`` (releases, versions, facts, families, layout: standard
    library and packaging only), from the checkout this file lies in when the running Python has none."""
    if "xlkv_autopatch" not in sys.modules and importlib.util.find_spec("xlkv_autopatch") is None:
        # the package from this checkout, by location: its submodules are then found in its folder
        folder = os.path.join(_REPO, "xlkv_autopatch")
        spec = importlib.util.spec_from_file_location("xlkv_autopatch", os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])
        package = importlib.util.module_from_spec(spec)
        sys.modules["xlkv_autopatch"] = package
        spec.loader.exec_module(package)
    return importlib.import_module("xlkv_autopatch." + name)


def _table():
    return shim("releases"), shim("versions")


#: name -> (the rows that have it, what it means)
GATES = {
    "native": (lambda row: row.mechanism != "backport",
               "vLLM's own cross-layer blocks (enable_cross_layers_blocks, later VLLM_KV_CACHE_LAYOUT=BLNHC)"),
    "layouts": (lambda row: row.mechanism == "layout",
                "KV cache layouts chosen once per engine (VLLM_KV_CACHE_LAYOUT)"),
    "runner-v1": (lambda row: row.runner_v1,
                  "a Model Runner V2 default that ignores cross-layer blocks (VLLM_USE_V2_MODEL_RUNNER=0 asks for V1)"),
}


def span(name):
    """The releases that have ``name``, as text ("in 0.22-0.28", "from 0.16 on", spans joined)."""
    releases, _ = _table()
    has = GATES[name][0]
    parts = []
    for run in releases.runs(lambda row: has(row) or None):
        first, last = run[0].release, run[-1].release
        parts.append("from %s on" % first if last == releases.RELEASES[-1].release else
                     "in " + (first if first == last else "%s-%s" % (first, last)))
    return ", ".join(parts) or "in no release"


def gate(name, version):
    """(True, "") when vLLM ``version`` has ``name``, else (False, why not)."""
    releases, versions = _table()
    has, what = GATES[name]
    row = releases.row_for(versions.release_tuple(version or "0"))
    if has(row):
        return True, ""
    return False, "%s: vLLM %s lacks %s, which vLLM has %s (xlkv_autopatch/releases.py)" % (
        name, version, what, span(name))
