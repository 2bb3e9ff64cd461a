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


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "nope", " "])
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


def test_pth_line_agrees_with_flag_parser():
    """The stdlib-only gate in the .pth and _startup.flag_on accept the same values."""
    from xlkv_autopatch._startup import flag_on

    line = open(PTH).read().strip()
    assert line.startswith("import ") and "\n" not in line
    gate = line.split('exec("', 1)[1].split(":\\n", 1)[0]  # "if <expr>"
    expr = gate[len("if "):]
    for v in ["1", "true", "True", "yes", "ON", " 1 ", "0", "", "false", "2", "enable", "y"]:
        env = {"ENABLE_XLKV": v}
        assert eval(expr, {"os": type("o", (), {"environ": env})}) == flag_on(env), v


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
