"""``python -m xlkv_autopatch status``: what an operator runs first on a new box."""

import importlib
import os
import site
import sys

from ._version import __version__
from .flag import FLAG, flag_state, invalid_flag_message

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


def _dependencies():
    """Runtime dependencies of the shim that cannot be imported: {name: error}."""
    missing = {}
    for name in ("wrapt", "packaging"):
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing[name] = str(e)
    return missing


def collect(resolve=True):
    missing = _dependencies()
    state = flag_state()
    out = {
        "xlkv_autopatch": __version__,
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "flag": {"name": FLAG, "value": os.environ.get(FLAG), "on": state == "on", "state": state},
        "activation": {
            "pth_files": pth_files(),
            "plugin_entry_points": plugin_entry_points(),
            "sitecustomize": sitecustomize_path(),
            "vllm_plugins_allowlist": os.environ.get("VLLM_PLUGINS"),
        },
        "missing_dependencies": missing,
        "patch_sets": [],
        "problems": [],
    }
    problems = out["problems"]
    if state == "invalid":
        problems.append(invalid_flag_message())
    for name, err in sorted(missing.items()):
        problems.append("%s cannot be imported (%s): with ENABLE_XLKV set, vLLM refuses to start. Fix: pip install "
                        "'%s' into this environment (xlkv_autopatch was probably installed with --no-deps)"
                        % (name, err, {"wrapt": "wrapt>=1.14", "packaging": "packaging>=21"}[name]))
    allow = out["activation"]["vllm_plugins_allowlist"]
    if allow is not None and PLUGIN_NAME not in [s.strip() for s in allow.split(",")]:
        problems.append(
            "VLLM_PLUGINS=%r does not list %s: vLLM will not load the plugin (the .pth hook still works)"
            % (allow, PLUGIN_NAME)
        )
    act = out["activation"]
    if not (act["pth_files"] or act["plugin_entry_points"] or act["sitecustomize"]):
        problems.append("no activation path: neither the .pth hook nor the vLLM plugin entry point is "
                        "installed, and the checkout's sitecustomize.py is not on PYTHONPATH")
    if missing:  # the rest needs packaging (versions) and wrapt (registry)
        out["vllm"] = None
        out["ok"] = False
        return out
    _collect_patches(out, resolve)
    out["ok"] = not problems
    return out


def _collect_patches(out, resolve):
    from . import patches, registry, versions
    from .errors import XlkvError

    version = versions.vllm_version()
    reg = registry.REGISTRY
    groups = reg.groups() or patches.all_groups()
    problems = out["problems"]
    out.update({
        "vllm": version,
        "vllm_version_override": os.environ.get(versions.OVERRIDE) or None,
        "supported_range": reg.supported,
        "supported": bool(version) and versions.in_range(version, reg.supported),
    })
    out["activation"].update({
        "installed_in_this_process": reg.state.installed,
        "sources": list(reg.state.sources),
        "applied": ["%s -> %s.%s" % a for a in reg.applied()],
    })
    out["kvcached_flags"] = patches.kvcached_flags()  # a conflict only with the flag on: the groups' precheck
    if version is None:
        problems.append("vLLM is not installed in this environment")
    elif not out["supported"]:
        problems.append(
            "vLLM %s is outside the supported range %s: with ENABLE_XLKV set, vLLM refuses to start"
            % (version, reg.supported)
        )
    for group in groups:
        applies = bool(version) and (group.always or versions.in_range(version, group.vllm))
        entry = {
            "name": group.name,
            "vllm": group.vllm,
            "trigger": group.trigger,
            "applies": applies,
            "patches": [{"name": s.name, "target": s.target, "kind": s.kind} for s in group.patches],
        }
        if applies and resolve:
            _resolve_group(group, entry, registry, XlkvError)
            if "error" in entry or not all(p.get("ok") for p in entry["patches"]):
                problems.append("patch set %s would not apply: %s" % (
                    group.name, entry.get("error") or "; ".join(p["error"] for p in entry["patches"] if not p.get("ok"))))
        out["patch_sets"].append(entry)


def _resolve_group(group, entry, registry, error_type):
    try:
        importlib.import_module(group.trigger)
        if group.precheck is not None:
            group.precheck()
    except error_type as e:
        entry["error"] = str(e)
    except Exception as e:  # report, never crash the status command
        entry["error"] = "cannot import %s: %s: %s" % (group.trigger, type(e).__name__, e)
    if "error" in entry:
        return
    for p, spec in zip(entry["patches"], group.patches):
        try:
            r = registry.resolve(spec)
            p["owner"] = registry._describe(r.holder)
            p["ok"] = True
            if r.already:
                p["note"] = "already patched in this process"
        except error_type as e:
            p["ok"] = False
            p["error"] = str(e)


def render(info):
    flag = {"on": "ON", "off": "off (stock vLLM)", "invalid": "NOT RECOGNISED (vLLM refuses to start)"}
    if info["missing_dependencies"]:
        vllm_line = "vLLM: not checked (missing: %s)" % ", ".join(sorted(info["missing_dependencies"]))
    else:
        vllm_line = "vLLM: %s%s" % (info["vllm"] or "not installed", "" if not info["vllm"] else (
            "  [supported]" if info["supported"] else "  [NOT supported: %s]" % info["supported_range"]))
    lines = [
        "xlkv_autopatch %s (python %s)" % (info["xlkv_autopatch"], info["python"]),
        vllm_line,
        "ENABLE_XLKV: %r -> %s" % (info["flag"]["value"], flag[info["flag"]["state"]]),
        "start-up hook (.pth): %s" % (", ".join(info["activation"]["pth_files"]) or "not installed"),
        "vLLM plugin entry point: %s" % (", ".join(info["activation"]["plugin_entry_points"]) or "not installed"),
    ]
    if info["activation"].get("sitecustomize"):
        lines.append("checkout sitecustomize.py: %s" % info["activation"]["sitecustomize"])
    if info.get("kvcached_flags") and not info["flag"]["on"]:
        lines.append("%s is set (kvcached's autopatch); no conflict while ENABLE_XLKV is off"
                     % "/".join(info["kvcached_flags"]))
    if info["activation"].get("installed_in_this_process"):
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
    if info["vllm"] and not any(g["applies"] and g["name"] != "guard" for g in info["patch_sets"]):
        lines.append("no patch set applies to vLLM %s" % info["vllm"])
    for prob in info["problems"]:
        lines.append("PROBLEM: %s" % prob)
    lines.append("status: %s" % ("OK" if info["ok"] else "NOT OK"))
    return "\n".join(lines)
