"""pytest plugin for experiments/upstream/upstream_tests.py: vLLM's own tests, stock or with the shim.

Loaded with ``-p xlkv_upstream_probe`` (its folder on PYTHONPATH).  It does three things:

* ``XLKV_UPSTREAM_MODE=stock``: a meta-path finder makes ``xlkv_autopatch`` unimportable
  before any test module imports vLLM, so vLLM's plugin loader cannot load the shim (it
  logs that the plugin failed to load and runs stock);
* records every test's outcome (passed / failed / error / skipped; setup and teardown
  failures count as error);
* at the end, writes the outcomes and what the shim really did in this process to
  ``XLKV_UPSTREAM_OUT``: a green "on" run in which no NIXL patch set was applied is a stock
  run, and the caller refuses it.
"""

import glob
import importlib.abc
import json
import os
import sys

MODE = os.environ.get("XLKV_UPSTREAM_MODE", "")
_outcomes = {}


class _NoShim(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "xlkv_autopatch" or fullname.startswith("xlkv_autopatch."):
            raise ModuleNotFoundError("xlkv_autopatch is hidden in the stock mode of the upstream tests",
                                      name=fullname)
        return None


if MODE == "stock":
    sys.meta_path.insert(0, _NoShim())


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    if report.when == "call":
        outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        if _outcomes.get(nodeid) != "error":
            _outcomes[nodeid] = outcome
    elif report.failed:  # setup or teardown
        _outcomes[nodeid] = "error"
    elif report.skipped and report.when == "setup":
        _outcomes[nodeid] = "skipped"


def pytest_collectreport(report):
    if report.failed:
        _outcomes[report.nodeid or "<collection>"] = "error"


def _shim_state():
    mod = sys.modules.get("xlkv_autopatch.registry")
    state = {"imported": "xlkv_autopatch" in sys.modules, "installed": False, "applied_groups": [],
             "version": None, "sources": []}
    if mod is not None:
        st = mod.REGISTRY.state
        state.update(installed=bool(st.installed), applied_groups=list(st.applied_groups), version=st.version,
                     sources=list(st.sources))
    return state


def _merge_workers(out, state):
    """Under pytest-xdist the tests (and vLLM) run in worker processes: their shim states are
    what counts; the controller only collects the reports."""
    for path in glob.glob(out + ".gw*"):
        with open(path) as f:
            w = json.load(f)
        os.unlink(path)
        state["imported"] = state["imported"] or w["imported"]
        state["installed"] = state["installed"] or w["installed"]
        state["applied_groups"] = sorted(set(state["applied_groups"]) | set(w["applied_groups"]))
        state["version"] = state["version"] or w["version"]
        state["sources"] = sorted(set(state["sources"]) | set(w["sources"]))
        state.setdefault("workers", []).append(os.path.basename(path).rsplit(".", 1)[-1])
    return state


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("XLKV_UPSTREAM_OUT")
    if not out:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        with open("%s.%s" % (out, worker), "w") as f:
            json.dump(_shim_state(), f)
        return
    with open(out, "w") as f:
        json.dump({"mode": MODE, "exitstatus": int(exitstatus), "outcomes": _outcomes,
                   "shim": _merge_workers(out, _shim_state())}, f, indent=1, sort_keys=True)
