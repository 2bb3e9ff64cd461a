"""The lab's server configurations: one table, one row per config, release gates from the shim's
release table (gates.py), so adding a bench or equivalence config is one row here.

    supported(name, version, settings, env) -> (True, "") or (False, why not)
    server_settings(name, version, settings, pythonpath) -> ServerSettings (env of both servers,
                                      D-only env and flags, kv_connector_extra_config, proxy flags)

``settings`` is the door's Settings; ``env`` the environment of the children that ask (the
servers' environment, settings.server_env), ``pythonpath`` the servers' PYTHONPATH.

A name ``nc-<config>`` is the negative control of <config>: its settings, and D starts with
experiments/negative_control/ first on its PYTHONPATH (the hook corrupts the KV D received,
NC_CORRUPTION says how).  A name ``dynamo-<config>`` is <config> served through NVIDIA Dynamo's
frontend and vLLM workers instead of the proxy and `vllm serve` (``router``; pdtools/dynamo.py).
"""

import hashlib
import json
import os
import subprocess
from collections import namedtuple

from . import dynamo
from .gates import gate
from .settings import EXIT_SETUP, NC_DIR, REPO_DIR, die

NEGATIVE_PREFIX = "nc-"
ServerSettings = namedtuple("ServerSettings", "env d_env d_args kv_extra proxy_args")

#: name -> (what it is, env of both servers, kv_connector_extra_config, D-only env, D-only flags,
#: proxy flags, needs: "shim" (the shim must support the release), a gate name, "ray")
ROW = namedtuple("Row", "about env kv_extra d_env d_args proxy_args needs")
OPT_IN = {"enable_cross_layers_blocks": "true"}
CONFIGS = {
    "stock": ROW("NixlConnector as shipped", {}, None, {}, [], [], ()),
    "prefill_only": ROW("P alone, stock settings (bench only: the physical limit of P/D TTFT)",
                        {}, None, {}, [], [], ()),
    "prefill_only-detok": ROW("P alone with the shim and XLKV_DETOK_TAIL=true (bench only): the limit the configs with "
                              "that switch are compared with",
                              {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"}, None, {}, [], [], ("shim",)),
    "shim": ROW("ENABLE_XLKV=true on P and D (xlkv_autopatch from this checkout)",
                {"ENABLE_XLKV": "true"}, None, {}, [], [], ("shim",)),
    "shim-keep-order": ROW("the shim without its descriptor ordering (XLKV_COALESCE=false): the ablation row",
                           {"ENABLE_XLKV": "true", "XLKV_COALESCE": "false"}, None, {}, [], [], ("shim",)),
    # the knob is a config of its own: server_env drops every shim variable an operator's shell exported
    "shim-equal-tp": ROW("the shim with XLKV_EQUAL_TP=true on P and D: vLLM 0.12-0.28 keep cross-layer blocks that "
                         "cannot be sliced by KV heads (the packed sliding-window rows of 0.24-0.28); every peer at one "
                         "TP size", {"ENABLE_XLKV": "true", "XLKV_EQUAL_TP": "true"}, None, {}, [], [], ("shim",)),
    # vLLM passes kv_connector_extra_config.num_threads to nixl_agent_config (its default is 4)
    "shim-ucx": ROW("the shim with more NIXL UCX threads (UCX_NUM_THREADS, default 8): the UCX lever's row",
                    {"ENABLE_XLKV": "true"}, "ucx", {}, [], [], ("shim",)),
    "shim-ids": ROW("the shim; the proxy gives D P's prompt token ids, not the text (a proxy-side lever)",
                    {"ENABLE_XLKV": "true"}, None, {}, [], ["--token-ids-to-d"], ("shim",)),
    "shim-detok": ROW("the shim with XLKV_DETOK_TAIL=true on P and D: each request's first token decoded against the "
                      "prompt's last 64 ids, not the whole prompt (patches/incremental_detokenizer.py)",
                      {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"}, None, {}, [], [], ("shim",)),
    "shim-ids-detok": ROW("shim-ids and shim-detok together: D gets P's prompt token ids (the proxy's lever), and "
                          "XLKV_DETOK_TAIL=true on P and D",
                          {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"}, None, {}, [], ["--token-ids-to-d"],
                          ("shim",)),
    "shim-ray": ROW("the shim with D's worker on Ray (TP 1): the flag reaches the Ray worker",
                    {"ENABLE_XLKV": "true"}, None, {"VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "ENABLE_XLKV"},
                    ["--distributed-executor-backend", "ray"], [], ("ray", "shim")),
    "native": ROW("vLLM's own best cross-layer setting without the shim: enable_cross_layers_blocks, "
                  "VLLM_KV_CACHE_LAYOUT=BLNHC where KV cache layouts are chosen per engine",
                  "native", None, {}, [], [], ("native",)),
    "native-v1": ROW("the opt-in with Model Runner V1 (V2, the default there, ignores the opt-in)",
                     {"VLLM_USE_V2_MODEL_RUNNER": "0"}, OPT_IN, {}, [], [], ("runner-v1",)),
    "stock-v1": ROW("stock with Model Runner V1, the runner the shim switches to: separates the runner "
                    "from the layout", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, None, {}, [], [], ("runner-v1",)),
}

#: the same rows served through NVIDIA Dynamo (its frontend and vLLM workers: pdtools/dynamo.py) instead of the
#: lab's proxy and `vllm serve`; the rows with proxy flags or D-only flags have no Dynamo twin
DYNAMO_ROWS = ("stock", "shim", "shim-detok", "native")
for _name in DYNAMO_ROWS:
    _row = CONFIGS[_name]
    CONFIGS[dynamo.PREFIX + _name] = _row._replace(about="%s; served through NVIDIA Dynamo (frontend + prefill and "
                                                         "decode workers)" % _row.about,
                                                   needs=_row.needs + ("dynamo",))


def router(name):
    """Who sends P's and D's requests for config ``name``: "dynamo" (Dynamo's frontend) or "proxy" (pd_proxy.py)."""
    return "dynamo" if base(name).startswith(dynamo.PREFIX) else "proxy"


def uses_shim(name):
    """Does config ``name`` turn the shim on (ENABLE_XLKV=true on its servers)?"""
    row = CONFIGS.get(base(name))
    return row is not None and isinstance(row.env, dict) and row.env.get("ENABLE_XLKV") == "true"


ALONE = "prefill_only"


def is_alone(name):
    """A prefill-alone config (P alone, max_tokens=1): ``prefill_only`` or ``prefill_only-<variant>``."""
    return name == ALONE or name.startswith(ALONE + "-")


def alone_for(name):
    """The prefill-alone config a P/D config is compared with: ``prefill_only-detok`` for a config with
    XLKV_DETOK_TAIL on P (P's own answer then skips the whole-prompt decode too), else ``prefill_only``."""
    row = CONFIGS.get(base(name))
    env = row.env if row is not None and isinstance(row.env, dict) else {}
    return ALONE + "-detok" if env.get("XLKV_DETOK_TAIL") == "true" else ALONE


def names():
    return ", ".join(list(CONFIGS) + ["nc-<config>"])


def base(name):
    return name[len(NEGATIVE_PREFIX):] if name.startswith(NEGATIVE_PREFIX) else name


def supported(name, version, settings, env, shim_check=None):
    """(True, "") when ``name`` can run on vLLM ``version`` (asked with the children's ``env``),
    else (False, why not)."""
    row = CONFIGS.get(base(name))
    if row is None:
        return False, "unknown config '%s' (%s)" % (name, names())
    for need in row.needs:
        if need == "ray":
            if subprocess.run([settings.get("PY"), "-c", "import ray"], env=env, capture_output=True).returncode != 0:
                return False, "%s: ray is not importable here (build the bundle with XLKV_BUNDLE_EXTRA=ray)" % name
        elif need == "dynamo":
            if subprocess.run([settings.get("PY"), "-c", "import importlib.util as u, sys; sys.exit(not ("
                               "u.find_spec('dynamo.vllm') and u.find_spec('dynamo.frontend')))"], env=env,
                              capture_output=True).returncode != 0:
                return False, ("%s: NVIDIA Dynamo (dynamo.vllm, dynamo.frontend) is not importable here (build the "
                               "bundle with ai-dynamo: experiments/README.md, \"Through NVIDIA Dynamo\")" % name)
        elif need == "shim":
            ok, why = (shim_check or shim_supported)(version, settings, env)
            if not ok:
                return False, why
        else:
            ok, why = gate(need, version)
            if not ok:
                return False, why if need != "runner-v1" else "%s\n%s: only meaningful where that default is" % (
                    why, name)
    return True, ""


def server_settings(name, version, settings, pythonpath=""):
    """The ServerSettings of config ``name`` on vLLM ``version``; ``pythonpath``: the servers'."""
    row = CONFIGS.get(base(name))
    if row is None:
        die(EXIT_SETUP, "unknown config %s" % name)
    env, kv_extra = row.env, row.kv_extra
    if env == "native":                 # the layout where layouts are chosen per engine, else the opt-in
        env, kv_extra = ({"VLLM_KV_CACHE_LAYOUT": "BLNHC"}, None) if gate("layouts", version)[0] else ({}, OPT_IN)
    if kv_extra == "ucx":
        kv_extra = {"num_threads": settings.get_int("UCX_NUM_THREADS", "8")}
    d_env = dict(row.d_env)
    if name.startswith(NEGATIVE_PREFIX):
        # the hook's sitecustomize.py goes first on D's PYTHONPATH and chains to the next one (the
        # checkout's, which turns the shim on where ENABLE_XLKV is set)
        d_env = {"PYTHONPATH": "%s:%s" % (NC_DIR, pythonpath),
                 "XLKV_NEGATIVE_CONTROL": settings.get("NC_CORRUPTION", "shift")}
    return ServerSettings(dict(env), d_env, list(row.d_args), json.dumps(kv_extra) if kv_extra else "",
                    list(row.proxy_args))


#: shim_supported's answers in this process: (python, version, env) -> (ok, why).  A job asks once per
#: config that needs the shim, and each question imports vLLM (about 24 s on a GPU machine: the
#: 2026-11-27 15:52 lease paid it before every shim config's start; the 21:35 lease, once per call, 19-29 s,
#: so a "supported" answer is also kept in WORK for the next call on the same machine and shim)
_SHIM_ANSWERS = {}


def shim_supported(version, settings, env):
    """Does the shim support the staged vLLM?  Asks ``python -m xlkv_autopatch status --json`` with
    the flag on.  From a source checkout neither the .pth hook nor the plugin entry point is
    installed (sitecustomize.py activates it), so that "problem" is not held against it: the
    release must be in the supported range and at least one patch set must apply without errors.
    The answer is kept for the same interpreter, release and environment (one question per job), and a
    "supported" one as a marker file in WORK/shim-supported/ for later jobs with the same shim files as well.
    SHIM_CHECK=0 skips the check (tests with a fake vLLM)."""
    if settings.get("SHIM_CHECK", "1") == "0":
        return True, ""
    key = (settings.get("PY"), version, tuple(sorted((k, v) for k, v in env.items() if _status_reads(k))))
    if key not in _SHIM_ANSWERS:
        work = settings.get("WORK")
        marker = os.path.join(work, "shim-supported", hashlib.sha256(
            json.dumps(list(key) + [shim_tree_digest()]).encode()).hexdigest()) if work else None
        if marker and os.path.exists(marker):
            _SHIM_ANSWERS[key] = (True, "")
        else:
            _SHIM_ANSWERS[key] = _ask_status(version, settings, env)
            if marker and _SHIM_ANSWERS[key][0]:      # only "supported" is kept: a refusal is asked again
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                open(marker, "w").close()
    return _SHIM_ANSWERS[key]


#: the environment variables that can change status's answer: the shim's knobs, vLLM's and the transfer
#: libraries' settings, and what decides which code and libraries the child imports.  The rest of a job's
#: environment (the device's per-call $OUT folder, shell variables) is left out of the key, so that a kept
#: answer is found by the next device call (on 2026-11-28 the lease's third bench call asked again, 20 s, though the
#: second had kept the answer: the whole environment was the key, likely with the device's per-call $OUT in it).
STATUS_ENV_PREFIXES = ("XLKV_", "ENABLE_XLKV", "VLLM_", "UCX_", "NIXL_", "CUDA_", "TORCH_")
STATUS_ENV_NAMES = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "HF_HOME")


def _status_reads(name):
    return name.startswith(STATUS_ENV_PREFIXES) or name in STATUS_ENV_NAMES


#: the shim's files whose content decides status's answer (the package and the checkout's activation hook)
SHIM_TREE = [os.path.join(REPO_DIR, "xlkv_autopatch"), os.path.join(REPO_DIR, "sitecustomize.py")]


def shim_tree_digest():
    """sha256 over the shim's source files (paths and bytes): a kept answer holds only for the same shim."""
    h = hashlib.sha256()
    for top in SHIM_TREE:
        paths = [top] if os.path.isfile(top) else sorted(
            os.path.join(d, f) for d, _, files in os.walk(top) for f in files if not f.endswith(".pyc"))
        for path in paths:
            h.update(os.path.relpath(path, REPO_DIR).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read() + b"\0")
    return h.hexdigest()


def _ask_status(version, settings, env):
    env = dict(env, ENABLE_XLKV="true")
    r = subprocess.run([settings.get("PY"), "-m", "xlkv_autopatch", "status", "--json"], cwd=REPO_DIR, env=env,
                       capture_output=True, text=True)
    try:
        j = json.loads(r.stdout)
    except ValueError:
        j = None
    if j is None:
        if r.returncode == 0:
            return True, ""
    else:
        sets = [g for g in j.get("patch_sets", []) if g.get("applies")]
        good = all("error" not in g and all(p.get("ok", True) for p in g.get("patches", [])) for g in sets)
        if j.get("supported") and sets and good:
            return True, ""
    text = subprocess.run([settings.get("PY"), "-m", "xlkv_autopatch", "status"], cwd=REPO_DIR, env=env,
                          capture_output=True, text=True)
    return False, "shim: xlkv_autopatch does not support vLLM %s here; its status says:\n%s" % (
        version, "\n".join("    " + line for line in (text.stdout + text.stderr).splitlines()))
