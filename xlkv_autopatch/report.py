"""``python -m xlkv_autopatch status``: what an operator runs first on a new box."""

import importlib
import os
import site
import sys

from . import __version__, versions
from ._startup import FLAG, flag_on

PTH_NAME = "xlkv_autopatch.pth"
PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "xlkv_autopatch"


def _site_dirs():
    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # virtualenv's old site.py
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    for p in sys.path:
        if p and p not in dirs and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            dirs.append(p)
    return dirs


def pth_files():
    return [os.path.join(d, PTH_NAME) for d in _site_dirs() if os.path.isfile(os.path.join(d, PTH_NAME))]


def plugin_entry_points():
    from importlib import metadata

    try:
        eps = metadata.entry_points(group=PLUGIN_GROUP)
    except TypeError:  # Python < 3.10
        eps = metadata.entry_points().get(PLUGIN_GROUP, [])
    return ["%s = %s" % (ep.name, ep.value) for ep in eps if ep.name == PLUGIN_NAME]


def sitecustomize_path():
    """The checkout's sitecustomize.py, when it is the one this interpreter ran."""
    mod = sys.modules.get("sitecustomize")
    if mod is not None and getattr(mod, "XLKV_AUTOPATCH_SITECUSTOMIZE", False):
        return getattr(mod, "__file__", None)
    return None


def collect(resolve=True):
    from . import registry
    from .errors import XlkvError

    version = versions.vllm_version()
    reg = registry.REGISTRY
    out = {
        "xlkv_autopatch": __version__,
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "vllm": version,
        "vllm_version_override": os.environ.get(versions.OVERRIDE) or None,
        "supported_range": reg.supported,
        "supported": bool(version) and versions.in_range(version, reg.supported),
        "flag": {"name": FLAG, "value": os.environ.get(FLAG), "on": flag_on()},
        "activation": {
            "pth_files": pth_files(),
            "plugin_entry_points": plugin_entry_points(),
            "sitecustomize": sitecustomize_path(),
            "vllm_plugins_allowlist": os.environ.get("VLLM_PLUGINS"),
            "installed_in_this_process": reg.state.installed,
            "sources": list(reg.state.sources),
            "applied": ["%s -> %s.%s" % a for a in reg.applied()],
        },
        "patch_sets": [],
        "problems": [],
    }
    allow = out["activation"]["vllm_plugins_allowlist"]
    if allow is not None and PLUGIN_NAME not in [s.strip() for s in allow.split(",")]:
        out["problems"].append(
            "VLLM_PLUGINS=%r does not list %s: vLLM will not load the plugin (the .pth hook still works)"
            % (allow, PLUGIN_NAME)
        )
    act = out["activation"]
    if not (act["pth_files"] or act["plugin_entry_points"] or act["sitecustomize"]):
        out["problems"].append("no activation path: neither the .pth hook nor the vLLM plugin entry point is "
                               "installed, and the checkout's sitecustomize.py is not on PYTHONPATH")
    if version is None:
        out["problems"].append("vLLM is not installed in this environment")
    elif not out["supported"]:
        out["problems"].append(
            "vLLM %s is outside the supported range %s: with ENABLE_XLKV set, vLLM refuses to start"
            % (version, reg.supported)
        )
    for group in reg.groups():
        applies = bool(version) and versions.in_range(version, group.vllm)
        entry = {
            "name": group.name,
            "vllm": group.vllm,
            "trigger": group.trigger,
            "applies": applies,
            "patches": [{"name": s.name, "target": s.target, "kind": s.kind} for s in group.patches],
        }
        if applies and resolve:
            try:
                importlib.import_module(group.trigger)
                if group.precheck is not None:
                    group.precheck()
            except XlkvError as e:
                entry["error"] = str(e)
            except Exception as e:  # report, never crash the status command
                entry["error"] = "cannot import %s: %s: %s" % (group.trigger, type(e).__name__, e)
            if "error" not in entry:
                for p, spec in zip(entry["patches"], group.patches):
                    try:
                        r = registry.resolve(spec)
                        p["owner"] = registry._describe(r.holder)
                        p["ok"] = True
                        if r.already:
                            p["note"] = "already patched in this process"
                    except XlkvError as e:
                        p["ok"] = False
                        p["error"] = str(e)
            if "error" in entry or not all(p.get("ok") for p in entry["patches"]):
                out["problems"].append("patch set %s would not apply: %s" % (
                    group.name, entry.get("error") or "; ".join(p["error"] for p in entry["patches"] if not p.get("ok"))))
        out["patch_sets"].append(entry)
    out["ok"] = not out["problems"]
    return out


def render(info):
    lines = [
        "xlkv_autopatch %s (python %s)" % (info["xlkv_autopatch"], info["python"]),
        "vLLM: %s%s" % (info["vllm"] or "not installed",
                        "" if not info["vllm"] else ("  [supported]" if info["supported"] else "  [NOT supported: %s]" % info["supported_range"])),
        "ENABLE_XLKV: %r -> %s" % (info["flag"]["value"], "ON" if info["flag"]["on"] else "off (stock vLLM)"),
        "start-up hook (.pth): %s" % (", ".join(info["activation"]["pth_files"]) or "not installed"),
        "vLLM plugin entry point: %s" % (", ".join(info["activation"]["plugin_entry_points"]) or "not installed"),
    ]
    if info["activation"].get("sitecustomize"):
        lines.append("checkout sitecustomize.py: %s" % info["activation"]["sitecustomize"])
    if info["activation"]["installed_in_this_process"]:
        lines.append("active in this process via: %s" % "+".join(info["activation"]["sources"]))
    for g in info["patch_sets"]:
        if not g["applies"]:
            continue
        lines.append("patch set %s (vLLM %s, on import of %s):" % (g["name"], g["vllm"], g["trigger"]))
        if "error" in g:
            lines.append("  ERROR: %s" % g["error"])
        for p in g["patches"]:
            mark = {True: "ok", False: "FAIL", None: "not resolved"}[p.get("ok")]
            lines.append("  [%s] %s (%s)%s%s" % (mark, p["target"], p["kind"],
                                                 " -> " + p["owner"] if p.get("owner") else "",
                                                 "  " + p["error"] if p.get("error") else ""))
    if not any(g["applies"] for g in info["patch_sets"]) and info["vllm"]:
        lines.append("no patch set applies to vLLM %s" % info["vllm"])
    for prob in info["problems"]:
        lines.append("PROBLEM: %s" % prob)
    lines.append("status: %s" % ("OK" if info["ok"] else "NOT OK"))
    return "\n".join(lines)
