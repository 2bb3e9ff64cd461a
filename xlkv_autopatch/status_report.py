"""``python -m xlkv_autopatch status`` and ``xlkv_autopatch.status()``: what an operator runs first on a new box.

:func:`collect` gathers the facts (a dict, also ``--json``), :func:`render` prints them.  (Not named
``status.py``: that submodule would replace the package's ``status()`` function once imported.)"""

import importlib
import importlib.util
import os
import site
import sys

from . import facts
from ._version import __version__
from .flag import FLAG, KNOBS, accepted, flag_state, knob_error, knob_state, removed_knob_notes

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


def _package():
    """(directory of this package, version in the installed metadata or None)."""
    from importlib import metadata

    try:
        meta = metadata.version("xlkv_autopatch")
    except metadata.PackageNotFoundError:
        meta = None
    return os.path.dirname(os.path.abspath(__file__)), meta


#: what every activation path does, with ENABLE_XLKV on, when activation fails (_startup.py)
REFUSES = ("vLLM refuses to start, whatever the activation path: the .pth hook and the checkout's sitecustomize.py "
           "raise this error at every import of vLLM, the vLLM plugin when vLLM loads it; nothing is patched and "
           "nothing runs stock")


def _shown(value):
    return "unset" if value is None else repr(value)


def collect(resolve=True):
    from ._startup import disarm

    # a refusal the start-up hook armed in this very process (status diagnoses; it does not serve):
    # lifted, so that status can look at vLLM, and reported
    refused = disarm()
    missing = _dependencies()
    state = flag_state()
    path, meta_version = _package()
    out = {
        "xlkv_autopatch": __version__,
        "xlkv_autopatch_path": path,
        "xlkv_autopatch_metadata_version": meta_version,
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "pid": os.getpid(),
        "flag": {"name": FLAG, "value": os.environ.get(FLAG), "on": state == "on", "state": state},
        "knobs": [{"name": k.name, "value": os.environ.get(k.name), "state": knob_state(k.name),
                   "default": "on" if k.default else "off", "accepted": accepted(k.name), "meaning": k.meaning}
                  for k in KNOBS],
        "activation": {
            "pth_files": pth_files(),
            "plugin_entry_points": plugin_entry_points(),
            "sitecustomize": sitecustomize_path(),
            "vllm_plugins_allowlist": os.environ.get("VLLM_PLUGINS"),
            "start_up_refusal": None if refused is None else "%s: %s" % (type(refused).__name__, refused),
        },
        "missing_dependencies": missing,
        "patch_sets": [],
        "problems": [],
    }
    problems = out["problems"]
    out["notes"] = notes = []
    if meta_version is not None and meta_version != __version__:
        notes.append("the installed metadata of xlkv_autopatch says %s but the code at %s is %s (an editable "
                     "install made before the version changed?). Fix: pip install -e <checkout> (or the new "
                     "release) again, so that pip, the entry point and the .pth match the code"
                     % (meta_version, path, __version__))
    from ._pth import render

    for pth in out["activation"]["pth_files"]:
        try:
            stale = open(pth).read() != render()
        except OSError:
            stale = False
        if stale:
            notes.append("%s is not the start-up hook of this version (%s): an install older than the code? Fix: "
                         "reinstall xlkv_autopatch into this environment" % (pth, __version__))
    for k in KNOBS:  # every knob error, predicted: with ENABLE_XLKV on, activate() refuses each one
        err = knob_error(k.name)
        if err and k.name != FLAG and state == "off":
            err += " (ENABLE_XLKV is off, so nothing refuses it now; once ENABLE_XLKV is on: %s)" % REFUSES
        elif err:
            err += " (%s)" % REFUSES
        if err:
            problems.append(err)
    notes.extend(removed_knob_notes())  # no refusal: whatever its value, the run is the one without it
    for name, err in sorted(missing.items()):
        problems.append("%s cannot be imported (%s): with ENABLE_XLKV set, %s. Fix: pip install '%s' into this "
                        "environment (%s)"
                        % (name, err, REFUSES.replace("raise this error", "raise the error naming it"),
                           {"wrapt": "wrapt>=1.14", "packaging": "packaging>=21"}[name], _how_installed()))
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


def _once_on(state):
    """The prefix of a refusal that only happens with the flag on, while it is off."""
    return "" if state == "on" else "(ENABLE_XLKV is off; once it is on:) "


def switches(f, flag_state_, environ=None):
    """What each switch that shortens the P/D handoff does on the release of facts ``f``: one dict per switch,
    ``{"name", "state", "does"}``, the knob's state as parsed and a sentence for this release and flag."""
    from . import prompt_tail
    from .patches import incremental_detokenizer as detok

    rel, state = facts.release_text(f), knob_state(detok.KNOB, environ)
    if not f.detokenizer_primes_prompt:
        does = ("nothing on vLLM %s: its detokenizer primes no prompt (vLLM %s prime the whole prompt; nothing is "
                "wrapped here)" % (rel, facts.span_of(lambda x: x.detokenizer_primes_prompt)))
    elif state == "on" and flag_state_ == "on":
        does = ("each request's first token is decoded against the prompt's last %d token ids, not the whole prompt "
                "as vLLM %s does (on the API server: P's answer and D's first token alike); the same text: where the "
                "tail could change a character, vLLM's priming is kept" % (prompt_tail.TAIL_IDS, rel))
    elif state == "on":
        does = "nothing: ENABLE_XLKV is not on, so the shim is not active (set ENABLE_XLKV=true too)"
    elif state == "off":
        does = ("off: vLLM %s decodes the whole prompt when each request's first token reaches the API server "
                "(set %s=true to decode it against the prompt's last %d ids)" % (rel, detok.KNOB, prompt_tail.TAIL_IDS))
    else:
        does = "not recognised (see the knob's error)"
    return [{"name": detok.KNOB, "state": state, "does": does}]


def runtime_refusals(f):
    """What the shim refuses at run time on the release of facts ``f`` (ENABLE_XLKV on; the request or
    the engine start fails with the cause and the fix), each derived from the release's facts."""
    from . import layout

    rel = facts.release_text(f)
    out = []
    how = ("vLLM's compatibility hash (tagged by xlkv)" if f.has_compat_hash else
           "xlkv's comparison of the layouts both sides registered (vLLM %s compares no hash)" % rel)
    out.append("a peer engine without ENABLE_XLKV=true (or one that kept the stock layout): the NIXL handshake is "
               "refused by %s; the request fails with its blocks invalid, this engine keeps serving" % how)
    larger, _ = layout.block_sizes_served(f, local_block_size=32, remote_block_size=16)
    smaller, _ = layout.block_sizes_served(f, local_block_size=16, remote_block_size=32)
    if larger.use:
        out.append("a different block size on prefill and decode (--block-size, or the attention kernel's block): "
                   "served where decode blocks hold a whole number R of prefill blocks, at R descriptors per decode "
                   "block per remote rank (%s), except with prefill TP > decode TP, MLA, a sliding-window KV cache "
                   "group or rows whose heads do not tile them (status --prefill-block-size N asks for one pair); "
                   "decode blocks smaller than prefill's: the handshake is refused (%s)"
                   % ("the receive restage puts each received row in token order", smaller.reason))
    else:
        out.append("a different block size on prefill and decode (--block-size, or the attention kernel's block): the "
                   "handshake is refused (%s)" % larger.reason)
    decisions = {b: layout.pair_served(f, local_tp=2, remote_tp=1, backend=b, heads_outermost_rows=True)
                 for b in f.cross_layer_backends}
    refused_tp = [b for b in f.cross_layer_backends if not decisions[b].use]
    if refused_tp:
        allowed = [b for b in f.cross_layer_backends if b not in refused_tp]
        out.append("heterogeneous TP (prefill and decode with different tensor-parallel sizes) with %s and "
                   "%s=true: the handshake is refused (%s); without %s (the default) such an engine keeps the stock "
                   "layout, says so in one INFO line, and every pairing is served as stock serves it%s" % (
                       "any backend" if not allowed else "/".join(refused_tp), layout.EQUAL_TP_KNOB,
                       decisions[refused_tp[0]].reason, layout.EQUAL_TP_KNOB,
                       "; %s keeps cross-layer blocks and is served (%s)" % ("/".join(allowed),
                                                                            decisions[allowed[0]].reason)
                       if allowed else ""))
    if f.mechanism == "layout":
        out.append("heterogeneous TP where this engine's %s block rows are padded, or its KV cache groups hold "
                   "different layer counts (its heads then do not tile each row; an INFO line at start-up says so): "
                   "the handshake is refused; vLLM itself refuses prefill TP > decode TP where prefill TP exceeds the "
                   "KV heads, with or without xlkv" % layout.HEADS_OUTERMOST_LAYOUT)
    if f.packed_groups:
        packed = layout.pair_served(f, local_tp=2, remote_tp=1, packed_groups=True)
        out.append("heterogeneous TP with a sliding-window + full attention hybrid (several KV cache groups) packed by "
                   "xlkv, which it does only with %s=true: the handshake is refused (%s); without it the hybrid keeps "
                   "the stock layout and every pairing is served" % (layout.EQUAL_TP_KNOB, packed.reason))
    if f.budget_block_count and f.mechanism == "layout":
        out.append("KV tensors holding more blocks than the scheduler's budget (an over-allocating allocator such as "
                   "kvcached): registration with NIXL is refused at start-up")
    if f.mechanism != "layout":
        out.append("KV tensors that disagree on their block count: registration with NIXL is refused at start-up")
    return out


def _how_installed():
    """Why a dependency may be missing: no installed distribution (a checkout on the path: nothing installed
    its dependencies), else an install without them."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("xlkv_autopatch")
    except importlib.metadata.PackageNotFoundError:
        return ("xlkv_autopatch itself is not installed here, it runs from a checkout on the path, where nothing "
                "installed its dependencies; `pip install <checkout>` installs them with it")
    return "xlkv_autopatch was probably installed with --no-deps"


def invalid_layout_problem(f, environ=None):
    """A VLLM_KV_CACHE_LAYOUT value vLLM itself refuses (layout.invalid_layout_value), flag on or off."""
    from . import layout

    env = os.environ if environ is None else environ
    return layout.invalid_layout_value(env.get("VLLM_KV_CACHE_LAYOUT"), mechanism=f.mechanism,
                                       release=facts.release_text(f))


def explicit_layout_problem(f, state):
    """0.29+ with the flag on and an explicit VLLM_KV_CACHE_LAYOUT that is not a whole-row layout: what
    runs instead of xlkv's layout (a note; with XLKV_STRICT=1 a problem: the engine refuses to start)."""
    from . import layout
    from .flag import knob

    if state != "on" or f.mechanism != "layout":
        return None
    decision = layout.explicit_layout(os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    if decision is None or decision.use:
        return None
    try:
        strict = knob("XLKV_STRICT")
    except Exception:  # a bad value is a problem of its own
        strict = False
    if strict:
        return ("XLKV_STRICT=1 and ENABLE_XLKV is set, but the stock per-layer KV layout would run: %s. vLLM stops at "
                "start-up. Fix: unset VLLM_KV_CACHE_LAYOUT (or XLKV_STRICT)" % decision.reason)
    return "ENABLE_XLKV is set, but the stock per-layer KV layout runs (a WARNING at start-up): %s" % decision.reason


def one_sided_hazard(f, state):
    """0.12-0.21 (facts: ``failed_recv_looks_up_engine``): a refused handshake kills a decode worker that runs
    without the shim (vLLM's own KeyError in get_finished); the shim guards only the side it runs on."""
    if not f.failed_recv_looks_up_engine:
        return None
    where = facts.span_of(lambda g: g.failed_recv_looks_up_engine)
    if state == "on":
        return ("vLLM %s (%s): the peer engine must have ENABLE_XLKV=true too. A decode engine without it dies at "
                "the refused handshake (vLLM's own KeyError in get_finished, looking up the refused engine; xlkv is "
                "not active there to guard it). Fix: set ENABLE_XLKV=true on prefill and decode alike"
                % (facts.release_text(f), where))
    return ("vLLM %s (%s), ENABLE_XLKV is off here: if the peer engine has ENABLE_XLKV=true, the NIXL handshake is "
            "refused and, if this engine decodes, it dies (vLLM's own KeyError in get_finished, looking up the "
            "refused engine; xlkv is not active here to guard it). Fix: set ENABLE_XLKV=true on both sides (or on "
            "neither)" % (facts.release_text(f), where))


def _collect_patches(out, resolve):
    from . import patches, registry, versions
    from .patches import _kvcached
    from .errors import XlkvError

    version = versions.vllm_version()
    reg = registry.REGISTRY
    groups = reg.groups() or patches.all_groups()
    problems = out["problems"]
    state = out["flag"]["state"]
    out.update({
        "vllm": version,
        "vllm_installed": versions.vllm_version(override=False),
        "vllm_version_override": versions.override_value(),
        "vllm_version_override_differs": versions.override_differs(),
        "supported_range": reg.supported,
        "supported": bool(version) and versions.in_range(version, reg.supported),
    })
    out["activation"].update({
        "installed_in_this_process": reg.state.installed,
        "sources": list(reg.state.sources),
        "applied": ["%s -> %s.%s" % a for a in reg.applied()],
    })
    out["kvcached_flags"] = _kvcached.kvcached_flags()  # a conflict only with the flag on
    if version is not None and out["supported"]:
        f = facts.facts_for(version)
        out["runtime_refusals"] = runtime_refusals(f)
        out["switches"] = switches(f, state)
        for k in out["knobs"]:
            k["no_effect"] = facts.knob_no_effect(k["name"], f, state)
            if k["name"] == "XLKV_DETOK_TAIL" and k["state"] == "on" and not k["no_effect"] \
                    and facts.dynamo_worker_installed():   # this process is no Dynamo worker; the served one may be
                k["no_effect_under_dynamo"] = facts.DYNAMO_DETOK
        bad_layout = invalid_layout_problem(f)
        if bad_layout:
            problems.append(bad_layout)
        explicit = None if bad_layout else explicit_layout_problem(f, state)
        if explicit:
            (problems if explicit.startswith("XLKV_STRICT") else out["notes"]).append(explicit)
        hazard = one_sided_hazard(f, state)
        if hazard:
            out["notes"].append(hazard)
    fix = versions.fix(reg.supported)
    if out["vllm_installed"] is None:
        problems.append(
            "vLLM is not installed in this environment (%s). xlkv_autopatch patches the vLLM of the environment it "
            "is installed in (vLLM %s). Fix: install it into vLLM's environment (<vLLM's python> -m pip install "
            "xlkv_autopatch, or -e <checkout>) and run <vLLM's python> -m xlkv_autopatch status there"
            % (sys.executable, reg.supported))
    if version is not None:
        try:  # the start-up refusal itself (unsupported release, dev build without a patch set, bad override)
            registry.Registry(patches.all_groups, supported=reg.supported).check_version(version)
        except XlkvError as e:
            problems.append(_once_on(state) + str(e))
    if out["kvcached_flags"] and state == "on":
        try:
            _kvcached.refuse_kvcached()
        except XlkvError as e:
            problems.append(str(e))
    if version is not None and resolve and out["supported"]:
        _check_triggers(out, [g for g in groups if g.nixl and versions.in_range(version, g.vllm)], fix, state)
    for group in groups:
        applies = bool(version) and (group.always or versions.in_range(version, group.vllm))
        entry = {
            "name": group.name,
            "vllm": group.vllm,
            "trigger": group.trigger,
            "applies": applies,
            "switch": group.knob,
            "patches": [{"name": s.name, "target": s.target, "kind": s.kind} for s in group.patches],
        }
        if applies and resolve:
            _resolve_group(group, entry, registry, XlkvError)
            if "error" in entry or not all(p.get("ok") for p in entry["patches"]):
                text = entry.get("error") or "; ".join(p["error"] for p in entry["patches"] if not p.get("ok"))
                if not any(known in text for known in problems):  # the kvcached conflict, once
                    if versions.override_differs() and versions.OVERRIDE + "=" not in text:
                        text += "; " + fix
                    problems.append(_once_on(state) + "patch set %s would not apply: %s" % (group.name, text))
        out["patch_sets"].append(entry)


def _check_triggers(out, nixl_groups, fix, state):
    """Predict XlkvNotAttachedError: load NixlConnector the way vLLM's connector factory does
    and check that this release's NIXL patch sets wait for a module that import brings in
    (a patch set of another release, chosen by XLKV_VLLM_VERSION, may wait for a module
    this vLLM never imports).  Only meaningful before anything imported those modules."""
    from . import versions

    pending = [g for g in nixl_groups if g.trigger not in sys.modules]
    if not pending:
        return
    try:
        factory = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
        cls = factory.KVConnectorFactory.get_connector_class_by_name("NixlConnector")
    except Exception:  # noqa: BLE001 - an older factory, or the import refused: reported elsewhere
        return
    for g in pending:
        try:
            importable = importlib.util.find_spec(g.trigger) is not None
        except (ImportError, ValueError):
            importable = False
        if g.trigger not in sys.modules and importable:  # (a module that is not there: the resolution says so)
            out["problems"].append(
                _once_on(state) + "patch set %s (for vLLM %s) waits for the import of %s, which vLLM's "
                "connector factory does not import (its NixlConnector is %s.%s): at its first NIXL connector vLLM "
                "stops with XlkvNotAttachedError. %s" % (
                    g.name, g.vllm, g.trigger, cls.__module__, cls.__qualname__,
                    fix if versions.override_differs() else "Fix: set %s to the release whose code this build "
                    "carries, or unset ENABLE_XLKV" % versions.OVERRIDE))


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
            p["owner"] = registry.describe(r.holder)
            p["ok"] = True
            if r.already:
                p["note"] = "already patched in this process"
        except error_type as e:
            p["ok"] = False
            p["error"] = str(e)


def _vllm_line(info):
    if info["missing_dependencies"]:
        return "vLLM: not checked (missing: %s)" % ", ".join(sorted(info["missing_dependencies"]))
    rng = info.get("supported_range")
    if not info.get("vllm_installed"):
        return "vLLM: not installed in this environment (%s)%s; xlkv_autopatch supports vLLM %s" % (
            info.get("python_executable"), "; XLKV_VLLM_VERSION=%s names vLLM %s" % (
                info["vllm_version_override"], info["vllm_version_override"]) if info.get("vllm_version_override")
            else "", rng)
    mark = "supported: %s" % rng if info["supported"] else "NOT supported; supported: %s" % rng
    if info.get("vllm_version_override_differs"):
        return "vLLM: %s installed; %s=%s overrides it, so the patch sets of vLLM %s are used  [%s]" % (
            info.get("vllm_installed") or "none", "XLKV_VLLM_VERSION", info["vllm_version_override"], info["vllm"],
            mark)
    return "vLLM: %s  [%s]" % (info["vllm"], mark)


def verdict(info):
    """The report's first line: OK, or NOT OK with how many PROBLEM lines follow."""
    if info["ok"]:
        return "status: OK"
    n = len(info["problems"])
    return "status: NOT OK (%d problem%s: the PROBLEM line%s below)" % (n, "" if n == 1 else "s",
                                                                      "" if n == 1 else "s")


def _refusal_core(text):
    """A start-up refusal's own sentence, without the exception name and the activation path's note."""
    text = text.split(": ", 1)[1] if text.startswith("Xlkv") and ": " in text else text
    return text.split(" [refused at ", 1)[0].strip()


def render(info):
    states = {"on": "on", "off": "off", "invalid": "NOT RECOGNISED"}
    lines = [
        verdict(info),
        "xlkv_autopatch %s at %s (python %s: %s)" % (info["xlkv_autopatch"], info.get("xlkv_autopatch_path"),
                                                     info["python"], info.get("python_executable")),
        _vllm_line(info),
    ]
    for k in info.get("knobs", []):
        what = states[k["state"]]
        if k["name"] == FLAG:
            what = {"on": "ON", "off": "off (stock vLLM)", "invalid": "NOT RECOGNISED (vLLM refuses to start)"}[
                k["state"]]
        elif k["state"] != "invalid" and not (k["value"] or "").strip():
            what += " (default)"
        if k.get("no_effect"):
            what += ", but %s" % k["no_effect"]
        if k.get("no_effect_under_dynamo"):
            what += "; NVIDIA Dynamo is installed here, and %s (in `vllm serve` it acts)" % k["no_effect_under_dynamo"]
        lines.append("%s: %s -> %s" % (k["name"], _shown(k["value"]), what))
    if "knobs" in info:
        lines.append("  (each accepts 1/true/yes/on, 0/false/no/off, or unset/empty for its default)")
    if "vllm_installed" in info:
        lines.append("XLKV_VLLM_VERSION: %s" % (
            "%r (the installed package says %s)" % (info["vllm_version_override"], info["vllm_installed"] or "no vLLM")
            if info.get("vllm_version_override") else "unset (the installed package's metadata decides)"))
    lines += [
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
        lines.append("patch set %s (vLLM %s, on import of %s%s):" % (
            g["name"], g["vllm"], g["trigger"],
            "; registered only while %s is on" % g["switch"] if g.get("switch") else ""))
        if "error" in g:
            lines.append("  ERROR: %s" % g["error"])
        for p in g["patches"]:
            mark = {True: "ok", False: "FAIL", None: "not resolved"}[p.get("ok")]
            lines.append("  [%s] %s (%s)%s%s" % (mark, p["target"], p["kind"],
                                                 " -> " + p["owner"] if p.get("owner") else "",
                                                 "  " + p["error"] if p.get("error") else ""))
    if info["vllm"] and not any(g["applies"] and g["name"] != "guard" for g in info["patch_sets"]):
        lines.append("no patch set applies to vLLM %s" % info["vllm"])
    refusal = info["activation"].get("start_up_refusal")
    if refusal:
        core = _refusal_core(refusal)
        said = any(core and core in p for p in info["problems"])  # the PROBLEM line says it: once
        lines.append("this process's start-up hook refused to activate (every import of vLLM raised it; status lifted "
                     "it to look further): %s" % ("%s, as a PROBLEM line below says" % refusal.split(":", 1)[0]
                                                   if said else refusal))
    for sw in info.get("switches", []):
        lines.append("switch %s on vLLM %s: %s" % (sw["name"], info["vllm"], sw["does"]))
    if info.get("runtime_refusals"):
        lines.append("refused at run time on vLLM %s with ENABLE_XLKV on (each names its cause and fix):" % info["vllm"])
        lines.extend("  - %s" % r for r in info["runtime_refusals"])
    for note in info.get("notes", []):
        lines.append("NOTE: %s" % note)
    for prob in info["problems"]:
        lines.append("PROBLEM: %s" % prob)
    return "\n".join(lines)
