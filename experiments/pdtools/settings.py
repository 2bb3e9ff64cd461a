"""The lab's settings, exit codes and messages.

Every job's settings are environment variables, as the operators' scripts always had them
(experiments/README.md lists them).  A door (``cli.main``: main.sh, pd_equivalence.sh, ...) reads
them once into a ``Settings`` and hands that object on; nothing of the lab writes the
environment.  A child process (a vLLM server, the proxy, the bench client, make_model.py ...)
gets its environment as an explicit dict built from the settings (``server_env``, ``Pair.child_env``).

    s = Settings.read()        # at the door: this process's environment, frozen
    s.get("WORK")              # "/tmp/xlkv-exp" unless WORK is set (and not empty)
    server_env(s)              # the servers' environment (the checkout and SITE first on PYTHONPATH ...)
    LabExit(code, message)     # raised by ``die``; the door prints "ERROR: message", exits code
"""

import dataclasses
import importlib.metadata
import importlib.util
import os
import sys
import time
import types
from typing import Mapping

EXIT_OK = 0
EXIT_FAIL = 1          # a check failed (outputs differ, descriptors too many, bench error)
EXIT_SETUP = 2         # set-up problem: vLLM not staged, port in use, server did not start
EXIT_NO_GPU = 3        # no GPU here: only the CPU checks ran (and passed)
EXIT_UNSUPPORTED = 4   # the staged vLLM release is not supported by the shim

EXP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # experiments/
REPO_DIR = os.path.dirname(EXP_DIR)
NC_DIR = os.path.join(EXP_DIR, "negative_control")

#: the environment variables every job shares, with their defaults (job-specific ones are
#: read where they are used, with their defaults written there once)
DEFAULTS = {
    "SITE": "/tmp/site",              # where the staged vLLM bundle lives (added to PYTHONPATH)
    "PY": "python3",                  # the Python that serves vLLM and runs make_model.py
    "WORK": "/tmp/xlkv-exp",          # logs and intermediate files of a run
    "TP_P": "1", "TP_D": "1",         # tensor-parallel size of P and D
    "GPU_MEM_UTIL": "0.3",            # --gpu-memory-utilization when P and D have their own GPUs
    "GPU_MEM_UTIL_SHARED": "0.25",    # ... when they share a GPU
    "PORT_PROXY": "8000", "PORT_P": "8100", "PORT_D": "8200",   # HTTP ports (127.0.0.1)
    "SIDE_P": "5600", "SIDE_D": "5700",                          # VLLM_NIXL_SIDE_CHANNEL_PORT of P, D
    "BLOCK_SIZE": "16", "MAX_MODEL_LEN": "16384",
    "READY_TIMEOUT": "600",           # seconds to wait for a server to answer /health
    "STOP_TIMEOUT": "30",
    "SERVE_EXTRA_ARGS": "",           # more `vllm serve` flags (word-split)
    "ENFORCE_EAGER": "1",             # 0: the servers capture CUDA graphs (no --enforce-eager; a longer start)
    "MODEL_ARCH": "qwen3",            # family of the generated model (make_model.py --arch)
    "REG_REPORT": "1",                # D writes its registration report (bytes per block id)
    "HANDOFF_TRACE": "0",             # 1: P, D and the proxy trace each request's handoff (pdtools/handoff.py)
    "XLKV_ACTIVE_RE": "xlkv_autopatch: .* is active",   # log line that proves the shim is active
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The environment a door found, frozen, read through DEFAULTS.  ``environ`` is also what
    every child process inherits (plus what the lab adds for it, explicitly)."""

    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    @classmethod
    def read(cls, environ=None):
        """At a door: this process's environment (or ``environ``), copied once."""
        return cls(types.MappingProxyType(dict(os.environ if environ is None else environ)))

    def get(self, name, default=None):
        """The value of ``name``, else (unset or empty, as the scripts always read them) its
        default: DEFAULTS, or ``default``."""
        return self.environ.get(name) or DEFAULTS.get(name, default)

    def get_int(self, name, default=None):
        return int(self.get(name, default))


class LabExit(Exception):
    """End the job with ``code``; ``message`` (if any) is printed as ERROR on stderr."""

    def __init__(self, code, message=""):
        super().__init__(message)
        self.code = code
        self.message = message


def die(code, message):
    raise LabExit(code, message)


def log(message):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), message), file=sys.stderr, flush=True)


def shim_variables():
    """The environment variables that change what the shim does: its flag and knobs (and the knobs of
    earlier versions, which it reports), and the vLLM release override, read from this checkout's
    xlkv_autopatch/flag.py and versions.py (standard library only, loaded by location)."""
    names = set()
    for name in ("flag", "versions"):
        path = os.path.join(REPO_DIR, "xlkv_autopatch", name + ".py")
        spec = importlib.util.spec_from_file_location("_xlkv_lab_" + name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if name == "flag":
            names |= {k.name for k in mod.KNOBS} | set(mod.REMOVED)
        else:
            names.add(mod.OVERRIDE)
    return frozenset(names)


def server_env(settings):
    """The servers' environment (and that of every other child of a job: the proxy, the bench
    client, the shim's status): the door's, with the checkout first on PYTHONPATH (its
    sitecustomize.py activates the shim where ENABLE_XLKV is on; with the flag off it does
    nothing; SHIM_PATH names another checkout), then the staged vLLM.  ENABLE_XLKV and every
    other variable the shim reads (``shim_variables``: XLKV_DETOK_TAIL, XLKV_STRICT, ...) are
    dropped from the door's environment: a config sets them per server (configs.CONFIGS), so an
    operator's shell that exports one neither runs ``stock`` or ``native`` with the shim nor
    changes what a shim config measures."""
    env = {k: v for k, v in settings.environ.items() if k not in shim_variables()}
    head = "%s:%s" % (settings.get("SHIM_PATH") or REPO_DIR, settings.get("SITE"))
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = head + (":" + old if old else "")
    env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"          # flashinfer is not in the bundle
    env.setdefault("VLLM_LOG_STATS_INTERVAL", "3")    # KV Transfer metrics lines
    env["PYTHONUNBUFFERED"] = "1"
    return env


def python_path(env):
    """Where a child with environment ``env`` looks: its PYTHONPATH first, then this interpreter's
    own path (the jobs run under $PY, the Python that serves vLLM)."""
    return [p for p in env.get("PYTHONPATH", "").split(":") if p] + [p for p in sys.path if p]


def vllm_version(path):
    """The vLLM release in ``path`` (a list of folders), from its package metadata without
    importing vLLM; None when there is none."""
    for d in importlib.metadata.distributions(name="vllm", path=list(path)):
        return d.version
    return None


def vllm_package_dir(path):
    for folder in path:
        pkg = os.path.join(folder, "vllm")
        if os.path.isfile(os.path.join(pkg, "__init__.py")):
            return pkg
    return None


def site_version(settings):
    """The vLLM release staged in SITE ("" when there is none)."""
    return vllm_version([settings.get("SITE")]) or ""


def require_vllm(env):
    """The release of the vLLM a child with environment ``env`` imports, or LabExit(EXIT_SETUP)
    saying how to stage one."""
    path = python_path(env)
    version = vllm_version(path)
    if not version:
        die(EXIT_SETUP, "vLLM is not importable (PYTHONPATH=%s).\n"
            "  Stage the bundle first (experiments/README.md): one call per chunk\n"
            "  'bash experiments/run_gpu_cell.sh --bundle DIR stage', then '... --bundle DIR setup'."
            % env.get("PYTHONPATH", ""))
    log("vLLM %s from %s" % (version, vllm_package_dir(path)))
    return version


def run_job(main, *args, **kw):
    """A job's ``main`` in this process; LabExit becomes its exit code, its message an ERROR line
    on stderr."""
    try:
        return main(*args, **kw)
    except LabExit as e:
        if e.message:
            print("\nERROR: %s" % e.message, file=sys.stderr, flush=True)
        return e.code
