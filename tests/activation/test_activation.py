"""Activation, always in subprocesses: the .pth hook, the vLLM plugin, sitecustomize, spawn.

A throw-away virtual environment gets the repository's ``xlkv_autopatch.pth`` in its
site-packages plus a path file that makes the checkout and this interpreter's packages
(wrapt, packaging) importable, i.e. the state ``pip install`` leaves behind.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTH = os.path.join(ROOT, "xlkv_autopatch.pth")


def _site_packages(prefix):
    out = subprocess.check_output(
        [os.path.join(prefix, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    )
    return out.strip()


def _this_site_packages():
    import wrapt

    return os.path.dirname(os.path.dirname(os.path.abspath(wrapt.__file__)))


@pytest.fixture(scope="session")
def pkgroot(tmp_path_factory):
    """A directory holding only the package (not the checkout's sitecustomize.py)."""
    d = tmp_path_factory.mktemp("pkgroot")
    os.symlink(os.path.join(ROOT, "xlkv_autopatch"), str(d / "xlkv_autopatch"))
    return str(d)


@pytest.fixture(scope="session")
def env_with_pth(tmp_path_factory, pkgroot):
    prefix = str(tmp_path_factory.mktemp("venv_pth"))
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    site = _site_packages(prefix)
    # '0' sorts before 'x': the paths exist when xlkv_autopatch.pth runs.
    with open(os.path.join(site, "0_xlkv_test_paths.pth"), "w") as f:
        f.write(pkgroot + "\n" + _this_site_packages() + "\n")
    shutil.copy(PTH, site)
    return os.path.join(prefix, "bin", "python")


@pytest.fixture(scope="session")
def env_without_pth(tmp_path_factory, pkgroot):
    prefix = str(tmp_path_factory.mktemp("venv_plain"))
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    with open(os.path.join(_site_packages(prefix), "0_xlkv_test_paths.pth"), "w") as f:
        f.write(pkgroot + "\n" + _this_site_packages() + "\n")
    return os.path.join(prefix, "bin", "python")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH", "XLKV_VLLM_VERSION")}
    env.update(extra)
    return env


def run_py(python, code, cwd=None, **env):
    return subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=clean_env(**env), cwd=cwd or "/", timeout=120)


PROBE = """
import json, sys
reg = sys.modules.get("xlkv_autopatch.registry")
print(json.dumps({
    "wrapt": "wrapt" in sys.modules,
    "xlkv": sorted(m for m in sys.modules if m.startswith("xlkv_autopatch")),
    "installed": bool(reg and reg.REGISTRY.state.installed),
    "sources": list(reg.REGISTRY.state.sources) if reg else [],
}))
"""


def probe(python, **env):
    r = run_py(python, PROBE, **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "OFF", " "])
def test_flag_off_imports_nothing(env_with_pth, value):
    env = {"ENABLE_XLKV": value} if value else {}
    got = probe(env_with_pth, **env)
    assert got == {"wrapt": False, "xlkv": [], "installed": False, "sources": []}


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_flag_on_activates_via_pth(env_with_pth, value):
    got = probe(env_with_pth, ENABLE_XLKV=value)
    assert got["installed"] is True
    assert got["sources"] == ["pth"]
    assert "xlkv_autopatch.registry" in got["xlkv"] and got["wrapt"] is True


def test_no_pth_no_activation(env_without_pth):
    got = probe(env_without_pth, ENABLE_XLKV="1")
    assert got["installed"] is False and got["xlkv"] == []


def test_pth_and_sitecustomize_gates_agree_with_flag_parser():
    """The stdlib-only gates in the .pth and sitecustomize.py go on exactly when
    _startup.flag_state is not "off" (an unrecognised value goes on, to be refused)."""
    import re

    from xlkv_autopatch.flag import FALSY, flag_state

    line = open(PTH).read().strip()
    assert line.startswith("import ") and "\n" not in line
    gate = line.split('exec("', 1)[1].split(":\\n", 1)[0]  # "if <expr>"
    expr = gate[len("if "):]
    site_tuple = re.search(r'in (\([^)]*\)):', open(os.path.join(ROOT, "sitecustomize.py")).read()).group(1)
    assert eval(site_tuple) == FALSY
    for v in ["1", "true", "True", "yes", "ON", " 1 ", "0", "", "false", "2", "enable", "y", " off "]:
        env = {"ENABLE_XLKV": v}
        namespace = {"os": type("o", (), {"environ": env}), "sys": type("s", (), {})}
        assert eval(expr, namespace) == (flag_state(env) != "off"), v


@pytest.mark.parametrize("value", ["enabled", "2", "y"])
def test_unrecognised_flag_value_is_refused_loudly(env_with_pth, value):
    """A typo in ENABLE_XLKV must not become a silent stock run: the .pth says so on stderr,
    the vLLM plugin (what every vLLM process calls) raises, and status reports it."""
    r = run_py(env_with_pth, "import sys; print(sorted(m for m in sys.modules if m.startswith('xlkv_autopatch.reg')))",
               ENABLE_XLKV=value)
    assert r.returncode == 0 and r.stdout.strip() == "[]"
    assert "start-up hook (pth) failed (XlkvFlagError" in r.stderr and "ENABLE_XLKV=%r" % value in r.stderr, r.stderr
    # once, although site.py of a 3.11 venv runs the .pth files of its site-packages twice
    assert r.stderr.count("start-up hook (pth) failed") == 1, r.stderr
    r = run_py(env_with_pth, "from xlkv_autopatch import plugin; plugin.register()", ENABLE_XLKV=value)
    assert r.returncode != 0 and "XlkvFlagError" in r.stderr
    assert "is not a value xlkv understands" in r.stderr and "set ENABLE_XLKV=true" in r.stderr
    r = subprocess.run([env_with_pth, "-m", "xlkv_autopatch", "status"], capture_output=True, text=True,
                       env=clean_env(ENABLE_XLKV=value), cwd="/", timeout=120)
    assert r.returncode == 1 and "NOT RECOGNISED" in r.stdout and "Traceback" not in r.stderr


def test_a_start_up_error_is_printed_once_per_process(env_with_pth, env_without_pth):
    """With ENABLE_XLKV=maybe the error line came twice (site.py of a 3.11 venv runs a
    .pth twice; the checkout's sitecustomize.py repeated it); vLLM's plugin still raises it."""
    r = run_py(env_with_pth, "pass", ENABLE_XLKV="maybe", PYTHONPATH=ROOT)
    assert r.stderr.count("ENABLE_XLKV='maybe'") == 1, r.stderr
    r = run_py(env_without_pth, "pass", ENABLE_XLKV="maybe", PYTHONPATH=ROOT)  # sitecustomize alone says it
    assert r.stderr.count("ENABLE_XLKV='maybe'") == 1 and "start-up hook (sitecustomize) failed" in r.stderr, r.stderr


@pytest.fixture(scope="session")
def env_without_wrapt(tmp_path_factory, pkgroot):
    """The shim installed with --no-deps next to packaging but without wrapt."""
    import packaging

    prefix = str(tmp_path_factory.mktemp("venv_nowrapt"))
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    deps = tmp_path_factory.mktemp("deps_nowrapt")
    os.symlink(os.path.dirname(os.path.abspath(packaging.__file__)), str(deps / "packaging"))
    site = _site_packages(prefix)
    with open(os.path.join(site, "0_xlkv_test_paths.pth"), "w") as f:
        f.write(pkgroot + "\n" + str(deps) + "\n")
    shutil.copy(PTH, site)
    python = os.path.join(prefix, "bin", "python")
    assert run_py(python, "import wrapt").returncode != 0
    return python


def test_missing_wrapt_is_reported_not_a_traceback(env_without_wrapt):
    for flag in ("", "1"):
        r = subprocess.run([env_without_wrapt, "-m", "xlkv_autopatch", "status", "--json"], capture_output=True,
                           text=True, env=clean_env(ENABLE_XLKV=flag), cwd="/", timeout=120)
        assert "Traceback" not in r.stderr, r.stderr
        info = json.loads(r.stdout)
        assert r.returncode == 1 and "wrapt" in info["missing_dependencies"]
        assert any("pip install 'wrapt>=1.14'" in p for p in info["problems"]), info["problems"]
    # flag on: the .pth names the cause on stderr, the vLLM plugin stops the process with it
    r = run_py(env_without_wrapt, "from xlkv_autopatch import plugin; plugin.register()", ENABLE_XLKV="1")
    assert "start-up hook (pth) failed (XlkvDependencyError" in r.stderr, r.stderr
    assert r.returncode != 0 and "XlkvDependencyError" in r.stderr.splitlines()[-1]
    assert "pip install 'wrapt>=1.14'" in r.stderr and "--no-deps" in r.stderr


def test_flag_off_plugin_imports_standard_library_only(env_without_pth):
    """What vLLM's plugin loader imports with the flag off (README, "Turning it off")."""
    code = """
    import json, sys
    before = set(sys.modules)
    import xlkv_autopatch.plugin
    xlkv_autopatch.plugin.register()
    new = sorted(set(sys.modules) - before)
    print(json.dumps(new))
    """
    r = run_py(env_without_pth, code)
    assert r.returncode == 0, r.stderr
    new = json.loads(r.stdout)
    ours = [m for m in new if m.split(".")[0] == "xlkv_autopatch"]
    assert ours == ["xlkv_autopatch", "xlkv_autopatch._startup", "xlkv_autopatch._version", "xlkv_autopatch.flag",
                    "xlkv_autopatch.plugin"], ours
    others = [m for m in new if m.split(".")[0] != "xlkv_autopatch"]
    assert all(m.split(".")[0] in sys.stdlib_module_names for m in others), others


def test_plugin_entry_activates_when_flag_set_inside_script(env_without_pth):
    code = """
    import os, sys
    from xlkv_autopatch import plugin
    plugin.register()
    print("off", "xlkv_autopatch.registry" in sys.modules, "wrapt" in sys.modules)
    os.environ["ENABLE_XLKV"] = "true"   # set after start-up: the .pth could not see it
    plugin.register(); plugin.register()
    from xlkv_autopatch.registry import REGISTRY
    print("on", REGISTRY.state.installed, REGISTRY.state.sources)
    """
    r = run_py(env_without_pth, code)
    assert r.returncode == 0, r.stderr
    assert "off False False" in r.stdout
    assert "on True ['vllm_plugin']" in r.stdout


def test_pth_then_plugin_is_one_install(env_with_pth):
    code = """
    from xlkv_autopatch import plugin
    from xlkv_autopatch.registry import REGISTRY
    n = len(__import__("sys").meta_path)
    plugin.register()
    print(REGISTRY.state.sources, len(__import__("sys").meta_path) == n)
    """
    r = run_py(env_with_pth, code, ENABLE_XLKV="1")
    assert r.returncode == 0, r.stderr
    assert "['pth', 'vllm_plugin'] True" in r.stdout


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_multiprocessing_children_are_active(env_with_pth, method, tmp_path):
    script = tmp_path / "mp.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp, sys

        def child(q):
            reg = sys.modules.get("xlkv_autopatch.registry")
            q.put((bool(reg and reg.REGISTRY.state.installed), list(reg.REGISTRY.state.sources) if reg else []))

        if __name__ == "__main__":
            ctx = mp.get_context(sys.argv[1])
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start(); print("child", q.get(timeout=60)); p.join(60)
    """))
    r = subprocess.run([env_with_pth, str(script), method], capture_output=True, text=True,
                       env=clean_env(ENABLE_XLKV="1"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "child (True, ['pth'])" in r.stdout


def test_unsupported_vllm_fails_loudly_at_vllm_import_in_spawn_child(env_with_pth, tmp_path):
    """Hooks are live in children: a vLLM outside the range refuses at ``import vllm``."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp

        def child(q):
            try:
                import vllm
                q.put("imported")
            except Exception as e:
                q.put("%s: %s" % (type(e).__name__, e))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start()
            print(q.get(timeout=60)); p.join(60)
    """))
    r = subprocess.run([env_with_pth, str(script)], capture_output=True, text=True, timeout=120,
                       env=clean_env(ENABLE_XLKV="1", XLKV_VLLM_VERSION="0.11.2", PYTHONPATH=str(fake)))
    assert r.returncode == 0, r.stderr
    assert "XlkvUnsupportedVersion" in r.stdout and "vLLM 0.11.2 is not supported" in r.stdout
    assert "unset ENABLE_XLKV" in r.stdout
    # a second import in the same process succeeds (vLLM is in sys.modules), but the refusal is
    # not one-shot: the connector factory guard repeats it when vLLM creates a NIXL connector
    factory = fake / "vllm" / "distributed" / "kv_transfer" / "kv_connector"
    factory.mkdir(parents=True)
    for d in (fake / "vllm" / "distributed", fake / "vllm" / "distributed" / "kv_transfer", factory):
        (d / "__init__.py").write_text("")
    (factory / "factory.py").write_text(textwrap.dedent("""
        class NixlConnector:
            pass

        class KVConnectorFactory:
            @classmethod
            def create_connector(cls, config, role, kv_cache_config=None):
                return NixlConnector()
    """))
    again = tmp_path / "again.py"
    again.write_text(textwrap.dedent("""
        try:
            import vllm
        except Exception as e:
            print("first:", type(e).__name__)
        import vllm
        print("second: imported")
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        try:
            KVConnectorFactory.create_connector(None, None)
            print("connector: created")
        except Exception as e:
            print("connector:", type(e).__name__, e)
    """))
    r = subprocess.run([env_with_pth, str(again)], capture_output=True, text=True, timeout=120,
                       env=clean_env(ENABLE_XLKV="1", XLKV_VLLM_VERSION="0.11.2", PYTHONPATH=str(fake)))
    lines = r.stdout.splitlines()
    assert lines[:2] == ["first: XlkvUnsupportedVersion", "second: imported"], r.stdout + r.stderr
    assert lines[2].startswith("connector: XlkvUnsupportedVersion") and "repeated" in lines[2], r.stdout
    # flag off: the same fake vLLM imports fine
    r = subprocess.run([env_with_pth, str(script)], capture_output=True, text=True, timeout=120,
                       env=clean_env(XLKV_VLLM_VERSION="0.11.2", PYTHONPATH=str(fake)))
    assert r.stdout.strip() == "imported", r.stderr


def test_sitecustomize_activates_and_chains(env_without_pth, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'ran'\n")
    code = """
    import os, sys
    reg = sys.modules.get("xlkv_autopatch.registry")
    print(os.environ.get("CHAINED_SITECUSTOMIZE"), bool(reg and reg.REGISTRY.state.installed),
          reg.REGISTRY.state.sources if reg else None, sys.modules["sitecustomize"].__file__)
    """
    r = run_py(env_without_pth, code, PYTHONPATH="%s:%s" % (ROOT, other), ENABLE_XLKV="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == ["ran", "True", "['sitecustomize']"]
    assert r.stdout.split()[3] == os.path.join(ROOT, "sitecustomize.py")
    # flag off: still chains, activates nothing
    r = run_py(env_without_pth, code, PYTHONPATH="%s:%s" % (ROOT, other))
    assert r.stdout.split()[:3] == ["ran", "False", "None"], r.stderr


def test_status_cli_without_vllm(env_with_pth):
    r = subprocess.run([env_with_pth, "-m", "xlkv_autopatch", "status", "--json"], capture_output=True,
                       text=True, env=clean_env(ENABLE_XLKV="1"), cwd="/", timeout=120)
    info = json.loads(r.stdout)
    assert r.returncode == 1  # no vLLM here: not OK, and it says why
    assert info["vllm"] is None and info["flag"]["on"] is True
    assert any("vLLM is not installed" in p for p in info["problems"])
    assert any(p.endswith("xlkv_autopatch.pth") for p in info["activation"]["pth_files"])


def test_pth_of_an_install_whose_package_is_gone_says_vllm_runs_stock(tmp_path):
    """An editable install whose checkout was removed keeps its .pth and entry point: vLLM's
    plugin loader only logs "Failed to load plugin", so nothing can stop vLLM, and the .pth
    line must not claim otherwise (both sides stock transfer correctly; one side stock is
    refused at handshake by the other side's tagged hash)."""
    prefix = str(tmp_path / "venv_gone")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
    shutil.copy(PTH, _site_packages(prefix))
    r = run_py(os.path.join(prefix, "bin", "python"), "print('ran')", ENABLE_XLKV="true")
    assert r.returncode == 0 and r.stdout.strip() == "ran"
    assert "No module named 'xlkv_autopatch'" in r.stderr
    assert "this process runs STOCK vLLM" in r.stderr and "will refuse" not in r.stderr


# --- one behaviour for a bad knob or a missing dependency, whatever the path ---

#: a stand-in vLLM that, like vLLM, runs the vllm.general_plugins entry points while it starts
FAKE_VLLM = """
from importlib.metadata import entry_points
for ep in entry_points(group="vllm.general_plugins"):
    ep.load()()  # vLLM calls each plugin without a try (vllm/plugins/__init__.py)
print("vllm started")
"""


@pytest.fixture(scope="session")
def make_env(tmp_path_factory, pkgroot):
    """make_env(pth=, wrapt=, plugin=) -> python of a venv with the package, packaging, optionally wrapt,
    the .pth hook and the plugin entry point (package metadata), and a stand-in vLLM."""
    import packaging

    made = {}

    def make(pth, wrapt, plugin):
        key = (pth, wrapt, plugin)
        if key in made:
            return made[key]
        prefix = str(tmp_path_factory.mktemp("venv_%d%d%d" % key))
        venv.EnvBuilder(with_pip=False, symlinks=True).create(prefix)
        site = _site_packages(prefix)
        deps = tmp_path_factory.mktemp("deps")
        os.symlink(os.path.dirname(os.path.abspath(packaging.__file__)), str(deps / "packaging"))
        if wrapt:
            import wrapt as w

            os.symlink(os.path.dirname(os.path.abspath(w.__file__)), str(deps / "wrapt"))
        os.makedirs(str(deps / "vllm"))
        (deps / "vllm" / "__init__.py").write_text(FAKE_VLLM)
        if plugin:
            meta = deps / "xlkv_autopatch-0.4.0.dist-info"
            meta.mkdir()
            (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: xlkv_autopatch\nVersion: 0.4.0\n")
            (meta / "entry_points.txt").write_text("[vllm.general_plugins]\nxlkv_autopatch = "
                                                   "xlkv_autopatch.plugin:register\n")
        with open(os.path.join(site, "0_xlkv_test_paths.pth"), "w") as f:
            f.write(pkgroot + "\n" + str(deps) + "\n")
        if pth:
            shutil.copy(PTH, site)
        python = os.path.join(prefix, "bin", "python")
        assert (run_py(python, "import wrapt").returncode == 0) is wrapt
        made[key] = python
        return python

    return make


@pytest.fixture(scope="session")
def checkout(tmp_path_factory):
    """The checkout as PYTHONPATH sees it, without what ``pip install -e`` leaves in it (an egg-info
    whose plugin entry point would refuse in sitecustomize.py's place)."""
    d = tmp_path_factory.mktemp("checkout")
    for name in ("sitecustomize.py", "xlkv_autopatch"):
        os.symlink(os.path.join(ROOT, name), str(d / name))
    return str(d)


#: path -> (make_env arguments, extra environment; CHECKOUT is the checkout fixture's directory)
PATHS = {
    "pth": (dict(pth=True, plugin=False), {}),
    "plugin": (dict(pth=False, plugin=True), {}),
    "sitecustomize": (dict(pth=False, plugin=False), {"PYTHONPATH": "CHECKOUT"}),
}


def _path(path, checkout):
    kwargs, extra = PATHS[path]
    return kwargs, {k: v.replace("CHECKOUT", checkout) for k, v in extra.items()}
BAD = {
    "XLKV_COALESCE=2": ({"XLKV_COALESCE": "2"}, "XlkvFlagError", "XLKV_COALESCE='2' is not a value xlkv understands"),
    "XLKV_STRICT=maybe": ({"XLKV_STRICT": "maybe"}, "XlkvFlagError", "XLKV_STRICT='maybe' is not a value"),
    "ENABLE_XLKV=maybe": ({"ENABLE_XLKV": "maybe"}, "XlkvFlagError", "ENABLE_XLKV='maybe' is not a value"),
    "no wrapt": ({}, "XlkvDependencyError", "its dependency wrapt cannot be imported"),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("path", list(PATHS))
def test_every_activation_path_refuses_a_bad_knob_or_a_missing_dependency_alike(make_env, checkout, path, bad):
    """Through the checkout's sitecustomize.py, XLKV_EARLY_LOAD=2 or a missing wrapt ran
    stock vLLM with one stderr line, where the .pth path refused.  Now vLLM does not start on any
    path, with the error naming the cause and the fix; the flag off, the same vLLM starts."""
    kwargs, extra = _path(path, checkout)
    env, kind, text = BAD[bad]
    python = make_env(wrapt=bad != "no wrapt", **kwargs)
    on = dict(extra, **dict({"ENABLE_XLKV": "1"}, **env))
    r = run_py(python, "import vllm", **on)
    assert r.returncode != 0 and "vllm started" not in r.stdout, (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("xlkv_autopatch.errors.%s: " % kind) and text in last and "Fix: " in last, r.stderr
    assert r.stderr.count(text) <= 2, r.stderr  # the start-up line and the raised error, no more
    # a process that never imports vLLM runs (pip, scripts): the refusal waits for vLLM
    r = run_py(python, "print('ran')", **on)
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    # the flag off: stock vLLM starts (a bad XLKV_* knob matters only with the flag on)
    if "ENABLE_XLKV" not in env:
        r = run_py(python, "import vllm", **dict(extra, **env))
        assert r.returncode == 0 and "vllm started" in r.stdout and "xlkv" not in r.stderr, r.stderr


@pytest.mark.parametrize("path", list(PATHS))
def test_every_activation_path_activates_with_good_knobs(make_env, checkout, path):
    kwargs, extra = _path(path, checkout)
    python = make_env(wrapt=True, **kwargs)
    code = "import vllm, sys; print(sys.modules['xlkv_autopatch.registry'].REGISTRY.state.sources)"
    r = run_py(python, code, **dict(extra, ENABLE_XLKV="1"))
    assert r.returncode == 0 and "vllm started" in r.stdout, r.stderr
    assert {"pth": "['pth']", "plugin": "['vllm_plugin']", "sitecustomize": "['sitecustomize']"}[path] in r.stdout


def test_a_caller_that_catches_the_refusal_still_cannot_import_vllm(make_env):
    python = make_env(pth=True, wrapt=True, plugin=False)
    code = """
    for i in range(2):
        try:
            import vllm
            print("imported")
        except Exception as e:
            print(type(e).__name__)
    """
    r = run_py(python, code, ENABLE_XLKV="1", XLKV_STRICT="maybe")
    assert r.stdout.split() == ["XlkvFlagError", "XlkvFlagError"], (r.stdout, r.stderr)


@pytest.mark.parametrize("path", ["pth", "sitecustomize"])
def test_status_says_what_happens_and_still_looks(make_env, checkout, path):
    """status run in a process whose start-up hook refused: it reports the refusal, lifts it to look at
    the (stand-in) vLLM, and its PROBLEM line says what every path does."""
    kwargs, extra = _path(path, checkout)
    python = make_env(wrapt=True, **kwargs)
    r = subprocess.run([python, "-m", "xlkv_autopatch", "status", "--json"], capture_output=True, text=True,
                       env=clean_env(ENABLE_XLKV="1", XLKV_COALESCE="2", **extra), cwd="/", timeout=120)
    info = json.loads(r.stdout)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert info["activation"]["start_up_refusal"].startswith("XlkvFlagError: xlkv_autopatch: XLKV_COALESCE='2'")
    (line,) = [p for p in info["problems"] if "XLKV_COALESCE='2'" in p]
    assert "vLLM refuses to start, whatever the activation path" in line, line
