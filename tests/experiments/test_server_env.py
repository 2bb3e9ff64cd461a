"""The servers' environment: a shell that exports ENABLE_XLKV or a shim knob must not reach a server
whose config does not set it (``stock`` benchmarked with the shim on, or ``shim`` measured with
XLKV_DETOK_TAIL, would be a wrong figure with the right label).  Each server's environment is taken
where the lab hands it to ``subprocess.Popen`` (pair.Pair.start_server); no process is started."""

import os
import sys

import pytest

EXP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
sys.path.insert(0, EXP)
from pdtools import configs, pair, settings  # noqa: E402

#: what an operator's shell may export: the flag, every knob (on values), a removed knob, the release
#: override, and lab settings that must pass (XLKV_ENVS, XLKV_HARNESS_PYTHON are the CPU harness's)
SHELL = {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true", "XLKV_STRICT": "1", "XLKV_EQUAL_TP": "true",
         "XLKV_COALESCE": "false", "XLKV_EARLY_LOAD": "1", "XLKV_VLLM_VERSION": "0.29.0",
         "XLKV_ENVS": "/envs", "XLKV_HARNESS_PYTHON": "/envs/py", "SOME_OTHER": "kept"}
SHIM_VARIABLES = {"ENABLE_XLKV", "XLKV_DETOK_TAIL", "XLKV_STRICT", "XLKV_EQUAL_TP", "XLKV_COALESCE",
                  "XLKV_EARLY_LOAD", "XLKV_NOTICE_WAIT", "XLKV_VLLM_VERSION"}


def test_the_shim_variables_are_its_flag_knobs_and_release_override():
    assert settings.shim_variables() == SHIM_VARIABLES


def test_server_env_drops_every_shim_variable_the_shell_exported():
    env = settings.server_env(settings.Settings.read(dict(SHELL, PYTHONPATH="/x")))
    assert not SHIM_VARIABLES & set(env), sorted(SHIM_VARIABLES & set(env))
    assert (env["XLKV_ENVS"], env["XLKV_HARNESS_PYTHON"], env["SOME_OTHER"]) == ("/envs", "/envs/py", "kept")
    assert env["PYTHONPATH"].endswith(":/x")


def _server_envs(monkeypatch, tmp_path, cfg, version):
    """{P, D: the environment each server of config ``cfg`` is started with}, the door's environment SHELL."""
    started = {}

    class Popen:
        def __init__(self, cmd, env=None, **kw):
            started[name] = dict(env)

    monkeypatch.setattr(pair.subprocess, "Popen", Popen)
    s = settings.Settings.read(dict(SHELL, WORK=str(tmp_path / "work"), REG_REPORT="1", PYTHONPATH=""))
    lab = pair.Pair(s)
    lab.version, lab.model, lab.mem_util = version, "/model", "0.3"
    for name in ("P", "D"):
        lab.start_server(name, cfg, 8100, 5600, "0", 1, str(tmp_path / ("%s.log" % name)))
    return started


@pytest.mark.parametrize("version", ["0.21.0", "0.33.0"])
def test_stock_and_native_servers_run_without_the_shim_the_shell_exported(monkeypatch, tmp_path, version):
    for cfg in ("stock", "native", "nc-stock", "prefill_only"):
        for side, env in _server_envs(monkeypatch, tmp_path, cfg, version).items():
            assert not SHIM_VARIABLES & set(env), (cfg, side, sorted(SHIM_VARIABLES & set(env)))
            assert env["SOME_OTHER"] == "kept"


def test_a_shim_config_gets_what_its_row_sets_and_nothing_the_shell_exported(monkeypatch, tmp_path):
    want = {"shim": {"ENABLE_XLKV": "true"},
            "shim-detok": {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"},
            "shim-keep-order": {"ENABLE_XLKV": "true", "XLKV_COALESCE": "false"},
            "shim-equal-tp": {"ENABLE_XLKV": "true", "XLKV_EQUAL_TP": "true"}}
    for cfg, variables in want.items():
        assert {k: v for k, v in configs.CONFIGS[cfg].env.items() if k in SHIM_VARIABLES} == variables, cfg
        for side, env in _server_envs(monkeypatch, tmp_path, cfg, "0.26.0").items():
            assert {k: env[k] for k in SHIM_VARIABLES & set(env)} == variables, (cfg, side)
