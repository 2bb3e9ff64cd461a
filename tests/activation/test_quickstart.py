"""README's quick start, run as written from this checkout's root: its first code block's commands (the
pip install and the two ``status`` calls), with only the placeholders replaced: the vLLM environment's
python by a fresh virtual environment's, and the model folder by one holding a Qwen3-0.6B-shaped
config.json.  Without vLLM in that environment ``status`` must still say what it is and what is missing.
With XLKV_QUICKSTART_VLLM=1 and a vLLM environment of the lab (``$XLKV_ENVS/vllm-<release>``, a release of
XLKV_TEST_VLLM), a second environment layered on it must get ``status: OK``: opt-in, because each status
there imports vLLM (312 s for the three commands beside vLLM 0.26.0 on the 2-core machine, under load)."""

import json
import os
import re
import subprocess
import sys
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from xlkv_autopatch._version import __version__  # noqa: E402

pytestmark = pytest.mark.slow

PYTHON = "/path/to/vllm-env/bin/python"   # the README's placeholders
MODEL = "/models/my-model"
#: Qwen3-0.6B's shape (experiments/model_shapes.py), what status --model reads from config.json
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
          "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 128, "max_position_embeddings": 40960, "vocab_size": 151936, "torch_dtype": "bfloat16"}


def quick_start_commands(readme):
    """The shell commands of the quick start's first code block, continuation lines joined."""
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```\n(.*?)\n```", quick, re.S)[0]
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_quick_start_is_one_install_and_two_status_calls():
    """What the slow test below runs is what README says, and nothing else: pip install from the checkout,
    then status without and with --model (cheap; the run is below)."""
    cmds = quick_start_commands(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    assert len(cmds) == 3, cmds
    assert re.fullmatch(re.escape(PYTHON) + r" -m pip install \.", cmds[0]), cmds[0]
    for cmd in cmds[1:]:
        assert cmd.startswith("ENABLE_XLKV=true %s -m xlkv_autopatch status" % PYTHON), cmd
    assert MODEL in cmds[2] and "--prefill-tp 1 --decode-tp 4" in cmds[2], cmds[2]


def run_quick_start(python, model_dir, readme=None):
    """Each command of the quick start, placeholders replaced, in bash from the checkout's root:
    [(command, returncode, output)]."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read() if readme is None else readme
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("XLKV_", "ENABLE_XLKV"))}
    out = []
    for cmd in quick_start_commands(readme):
        cmd = cmd.replace(PYTHON, python).replace(MODEL, model_dir)
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        out.append((cmd, r.returncode, r.stdout + r.stderr))
    return out


def _model(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    return str(d)


def _site(python):
    return subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()


def problems_without_vllm(results, python):
    """Why the quick start's run in an environment without vLLM is not what README promises ([] if it is):
    the install succeeds, and each status call reports this installed version (not the checkout's files)
    and exits 1 with one PROBLEM, that vLLM is not installed; --model still answers for the model."""
    bad = []
    (install, rc, text), status, model = results
    if rc != 0:
        return ["pip install failed (%d): %s" % (rc, text[-2000:])]
    site = _site(python)
    for cmd, rc, text in (status, model):
        head = "xlkv_autopatch %s at %s" % (__version__, os.path.join(site, "xlkv_autopatch"))
        if rc != 1 or not text.startswith("status: NOT OK (1 problem"):
            bad.append("%s: exit %d, first line %r" % (cmd, rc, text.splitlines()[:1]))
        if head not in text:
            bad.append("%s: not the installed %s (%r)" % (cmd, __version__, text.splitlines()[1:2]))
        if not re.search(r"^PROBLEM: vLLM is not installed in this environment \(%s\)" % re.escape(python), text, re.M):
            bad.append("%s: no PROBLEM line saying vLLM is not installed" % cmd)
    if "pair: prefill TP 1 -> decode TP 4: served" not in model[2]:
        bad.append("%s: no answer for the TP 1 -> 4 pair" % model[0])
    return bad


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory):
    path = tmp_path_factory.mktemp("quickstart") / "env"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(str(path))
    return os.path.join(str(path), "bin", "python")


def test_the_quick_start_runs_verbatim_without_vllm(fresh_python, tmp_path):
    results = run_quick_start(fresh_python, _model(tmp_path))
    assert problems_without_vllm(results, fresh_python) == [], "\n".join(
        problems_without_vllm(results, fresh_python) + ["%s -> %d\n%s" % r for r in results])


def _lab_vllm_python():
    envs = os.environ.get("XLKV_ENVS", "/work/envs")
    wanted = os.environ.get("XLKV_TEST_VLLM", "0.14.1 0.21.0 0.26.0 0.33.0").split()
    for release in reversed(wanted):
        py = os.path.join(envs, "vllm-%s" % release, "bin", "python")
        if os.path.exists(py):
            return py
    return None


def test_the_quick_start_says_ok_beside_a_real_vllm(tmp_path):
    """A fresh environment layered on a lab vLLM environment (its site-packages behind the new one's, as a
    derived image's layer; the vLLM environment itself is not changed): the same commands, status: OK."""
    if os.environ.get("XLKV_QUICKSTART_VLLM") != "1":
        pytest.skip("opt-in: XLKV_QUICKSTART_VLLM=1 (each status imports vLLM: minutes)")
    vllm_py = _lab_vllm_python()
    if vllm_py is None:
        pytest.skip("no vLLM environment of XLKV_TEST_VLLM under $XLKV_ENVS")
    base = subprocess.check_output([vllm_py, "-c", "import sys; print(sys._base_executable)"], text=True).strip()
    env_dir = tmp_path / "env"
    subprocess.run([base, "-m", "venv", str(env_dir)], check=True, timeout=600)
    py = str(env_dir / "bin" / "python")
    with open(os.path.join(_site(py), "_vllm_base.pth"), "w") as f:
        f.write("import site; site.addsitedir(%r)\n" % _site(vllm_py))
    results = run_quick_start(py, _model(tmp_path))
    for cmd, rc, text in results:
        assert rc == 0, "%s -> %d\n%s" % (cmd, rc, text[-3000:])
    for cmd, rc, text in results[1:]:
        assert text.startswith("status: OK"), (cmd, text[:500])
        assert "xlkv_autopatch %s at %s" % (__version__, os.path.join(_site(py), "xlkv_autopatch")) in text, text[:500]


def test_the_check_sees_a_quick_start_that_does_not_install(fresh_python, tmp_path):
    """Planted in a copy of README: the old `pip install ./xlkv_autopatch`, which pip refuses from a checkout
    (./xlkv_autopatch is the package, not a project). Its failure is reported, not passed over. Runs after
    the verbatim test, so the environment already holds the shim: only the install line can fail."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    planted = readme.replace("-m pip install .\n", "-m pip install ./xlkv_autopatch\n", 1)
    assert planted != readme
    results = run_quick_start(fresh_python, _model(tmp_path), planted)
    assert results[0][1] != 0, results[0]
    assert problems_without_vllm(results, fresh_python)[0].startswith("pip install failed"), results[0]
