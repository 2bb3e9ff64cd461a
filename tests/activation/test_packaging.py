"""Packaging: the wheel carries the .pth at its root and the vLLM plugin entry point, and no
sitecustomize.py; both a wheel install and ``pip install -e .`` activate through the .pth."""

import json
import os
import subprocess
import sys
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow


def pip(python, *args, **kw):
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = pip(sys.executable, "wheel", "--no-deps", "-q", "-w", str(out), ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = [p for p in out.iterdir() if p.suffix == ".whl"]
    return str(whl)


def test_wheel_contents(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "xlkv_autopatch.pth" in names  # at the root => site-packages
        assert z.read("xlkv_autopatch.pth") == open(os.path.join(ROOT, "xlkv_autopatch.pth"), "rb").read()
        assert not [n for n in names if n.endswith("sitecustomize.py")]
        assert "xlkv_autopatch/patches/__init__.py" in names
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(ep).decode()
        assert "[vllm.general_plugins]" in text and "xlkv_autopatch = xlkv_autopatch.plugin:register" in text
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
        base = [r for r in requires if "extra ==" not in r]
        assert sorted(r.split(">")[0].split("=")[0] for r in base) == ["packaging", "wrapt"]


def _fresh_env(path):
    venv.EnvBuilder(with_pip=True, symlinks=True).create(str(path))
    return os.path.join(str(path), "bin", "python")


PROBE = ("import sys, json; r = sys.modules.get('xlkv_autopatch.registry'); "
         "print(json.dumps([bool(r and r.REGISTRY.state.installed), 'wrapt' in sys.modules]))")


def _probe(python, flag):
    env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH")}
    if flag:
        env["ENABLE_XLKV"] = "1"
    r = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _site(python):
    return subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()


def test_wheel_install_activates_and_uninstall_removes_pth(wheel, tmp_path):
    py = _fresh_env(tmp_path / "env")
    r = pip(py, "install", "-q", wheel)
    assert r.returncode == 0, r.stdout + r.stderr
    pth = os.path.join(_site(py), "xlkv_autopatch.pth")
    assert os.path.isfile(pth)
    assert _probe(py, flag=False) == [False, False]
    assert _probe(py, flag=True) == [True, True]
    r = pip(py, "uninstall", "-y", "-q", "xlkv_autopatch")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(pth)


def test_editable_install_has_pth(tmp_path):
    py = _fresh_env(tmp_path / "env")
    r = pip(py, "install", "-q", "-e", ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    site = _site(py)
    assert os.path.isfile(os.path.join(site, "xlkv_autopatch.pth")), os.listdir(site)
    assert _probe(py, flag=False) == [False, False]
    assert _probe(py, flag=True) == [True, True]
    r = pip(py, "uninstall", "-y", "-q", "xlkv_autopatch")
    assert r.returncode == 0 and not os.path.exists(os.path.join(site, "xlkv_autopatch.pth"))
