"""The lab: its shell doors (syntax, thinness), its settings, configs, GPU split and ports
(experiments/pdtools), and end-to-end runs of its jobs through the doors against a fake vLLM.

The end-to-end tests put ``fake_bin/nvidia-smi`` (two "NVIDIA H200") first on PATH and
``fake_vllm`` (a tiny aiohttp server speaking vLLM's HTTP API and KV-metrics log format,
see its docstring) as SITE, so pd_equivalence.sh / pd_bench.sh run their real code paths
(ports, start/wait/stop, proxy, prompts, log + Prometheus parsing, JSON) on a CPU machine.
They need aiohttp in the test interpreter; ports 18xxx-19xxx on 127.0.0.1.
"""

import glob
import json
import os
import re
import socket
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXP = os.path.join(ROOT, "experiments")
#: the lab's shell, plus the environment builder it shares with the tests (tests/harness/mkenv.sh)
SCRIPTS = sorted(glob.glob(os.path.join(EXP, "*.sh")) + glob.glob(os.path.join(EXP, "*", "*.sh")) +
                 [os.path.join(ROOT, "tests", "harness", "mkenv.sh")])
sys.path.insert(0, EXP)
from pdtools import configs, pair, settings  # noqa: E402
from pdtools.gates import gate  # noqa: E402

#: the environment builders, which may stay shell
BUILDERS = ("bundle.sh", "mkenv.sh")
DOORS = {"main.sh": "main", "pd_equivalence.sh": "equivalence", "pd_bench.sh": "bench", "run_gpu_cell.sh": "cell",
         "gpu.sh": "upstream"}


def test_there_are_scripts():
    names = {os.path.basename(s) for s in SCRIPTS}
    assert set(DOORS) | set(BUILDERS) == names


def test_the_shell_doors_are_thin():
    """Outside the environment builders the lab's shell is thin doors into its
    one Python package (<= ~150 lines in all), each handing its arguments to one job."""
    doors = [s for s in SCRIPTS if os.path.basename(s) not in BUILDERS]
    assert sum(len(open(s).read().splitlines()) for s in doors) <= 150
    for s in doors:
        code = [l for l in open(s).read().splitlines() if l.strip() and not l.startswith("#")]
        job = DOORS[os.path.basename(s)]
        assert code[-1].startswith('exec "${PY:-python3}"') and code[-1].endswith('pdtools" %s "$@"' % job), (s, code)
        assert len(code) == 2, (s, code)    # set -euo pipefail, then the exec


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_bash_syntax(script):
    r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_scripts_are_strict(script):
    assert "set -euo pipefail" in open(script).read()


@pytest.mark.parametrize("version,name,has", [
    ("0.15.1", "native", False), ("0.16.0", "native", True), ("0.33.0", "native", True),
    ("0.28.2", "layouts", False), ("0.29.0", "layouts", True), ("0.100.0", "layouts", True),
    ("0.21.1", "runner-v1", False), ("0.22.0", "runner-v1", True), ("0.28.0", "runner-v1", True),
    ("0.29.0", "runner-v1", False), ("0.9.2", "native", False)])
def test_release_gate_reads_the_shims_release_table(version, name, has):
    """The lab's release gates come from xlkv_autopatch/releases.py (pdtools gate), so a
    boundary is written once; a release without the thing says which releases have it."""
    ok, why = gate(name, version)
    assert ok is has, why
    if not has:
        assert "vLLM %s lacks" % version in why and "releases.py" in why, why
    r = subprocess.run([sys.executable, os.path.join(EXP, "pdtools"), "gate", name, version], capture_output=True,
                       text=True)
    assert (r.returncode == 0) is has and r.stdout.strip() == why


#: lines of the lab (not its environment builders) that compare a vLLM version with a literal
VERSION_LITERAL = re.compile(r"version_(ge|lt)\b|(>=?|<=?)\s*\(0,\s*\d+")


def test_no_release_boundary_is_typed_in_the_lab():
    """Every release gate of the lab reads releases.py; the environment builders
    (bundle.sh, tests/harness/mkenv.sh) and the probes may name versions."""
    skip = {"bundle.sh", "mkenv.sh"}
    found = []
    for dirpath, dirnames, files in os.walk(EXP):
        dirnames[:] = [d for d in dirnames if d not in ("results", "probes", "__pycache__", "upstream")]
        for name in files:
            if name in skip or not name.endswith((".sh", ".py")):
                continue
            path = os.path.join(dirpath, name)
            for n, line in enumerate(open(path), 1):
                code = line.split("#", 1)[0]
                if VERSION_LITERAL.search(code):
                    found.append("%s:%d: %s" % (os.path.relpath(path, EXP), n, line.strip()))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("ngpu,tp_p,tp_d,expect", [
    (2, 1, 1, "0|1|0|0.3"),
    (1, 1, 1, "0|0|1|0.25"),
    (8, 1, 1, "0|1|0|0.3"),
    (2, 1, 2, "0|0,1|1|0.25"),
    (4, 1, 2, "0|1,2|0|0.3"),
    (4, 2, 2, "0,1|2,3|0|0.3"),
])
def test_assign_gpus(ngpu, tp_p, tp_d, expect, monkeypatch, tmp_path):
    for k, v in dict(TP_P=tp_p, TP_D=tp_d, WORK=tmp_path).items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", raising=False)
    lab = pair.Pair(settings.Settings.read(), "0.26.0")
    lab.ngpu = ngpu
    lab.assign_gpus()
    assert "%s|%s|%d|%s" % (lab.p_gpus, lab.d_gpus, lab.shared_gpu, lab.mem_util) == expect


def test_assign_gpus_too_few():
    with pytest.raises(settings.LabExit) as e:
        pair.split_gpus(1, 1, 2)
    assert e.value.code == 2 and "need at least 2 GPUs" in e.value.message


def _cfg(name, version="0.26.0"):
    """A config's settings as the lab applies them: (env of both, kv extra, D-only env, D-only flags, proxy),
    with this environment as the door's and its PYTHONPATH as the servers'."""
    s = configs.server_settings(name, version, settings.Settings.read(), os.environ.get("PYTHONPATH", ""))
    return (" ".join("%s=%s" % kv for kv in s.env.items()), s.kv_extra,
            " ".join("%s=%s" % kv for kv in s.d_env.items()), " ".join(s.d_args), " ".join(s.proxy_args))


def _supported(name, version):
    return _why(name, version)[0]


def _why(name, version):
    """configs.supported with this environment as the door's and the children's."""
    return configs.supported(name, version, settings.Settings.read(), dict(os.environ))


def test_config_env_and_support(monkeypatch):
    monkeypatch.setenv("SHIM_CHECK", "0")
    assert _cfg("native-v1")[:2] == ("VLLM_USE_V2_MODEL_RUNNER=0", '{"enable_cross_layers_blocks": "true"}')
    assert _cfg("shim")[:2] == ("ENABLE_XLKV=true", "")
    assert _supported("native", "0.21.0") and not _supported("native-v1", "0.21.0")
    assert _supported("native-v1", "0.26.0")
    # stock on the V1 model runner: the shim's runner without its layout (0.22-0.28)
    assert _cfg("stock-v1")[:2] == ("VLLM_USE_V2_MODEL_RUNNER=0", "")
    assert _supported("stock-v1", "0.26.0") and not _supported("stock-v1", "0.33.0")
    # native = vLLM's own best configuration: the opt-in up to 0.28, the BLNHC layout from 0.29
    assert _supported("native", "0.29.0")
    ok, why = _why("native", "0.15.1")
    assert not ok and "from 0.16 on" in why
    assert _cfg("native", "0.33.0")[:2] == ("VLLM_KV_CACHE_LAYOUT=BLNHC", "")
    assert _cfg("native", "0.28.0")[:2] == ("", '{"enable_cross_layers_blocks": "true"}')
    assert not _supported("bogus", "0.21.0")
    with pytest.raises(settings.LabExit):
        configs.server_settings("bogus", "0.21.0", settings.Settings.read())
    # negative controls: the config's own settings on both sides, the hook on D only
    monkeypatch.setenv("PYTHONPATH", "/repo:/site")
    both, _, d_only = _cfg("nc-shim")[:3]
    assert both == "ENABLE_XLKV=true"
    assert d_only == "PYTHONPATH=%s/negative_control:/repo:/site XLKV_NEGATIVE_CONTROL=shift" % EXP
    assert _supported("nc-stock", "0.21.0") and not _supported("nc-native", "0.15.1")


def test_site_version_is_defined_once_and_reads_the_staged_release(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "vllm-0.26.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    assert settings.site_version(settings.Settings.read({"SITE": str(site)})) == "0.26.0"
    assert settings.site_version(settings.Settings.read({"SITE": str(tmp_path / "none")})) == ""
    lab = glob.glob(os.path.join(EXP, "pdtools", "*.py")) + [s for s in SCRIPTS if not s.endswith("bundle.sh")]
    defs = [s for s in lab if re.search(r"def site_version\b|site_version\(\) \{", open(s).read())]
    assert [os.path.basename(s) for s in defs] == ["settings.py"]


def test_scripts_name_only_scripts_that_exist():
    # the shell once pointed at stage_bundle.sh / setup_bundle.sh, which never existed
    import re
    for s in SCRIPTS:
        if os.path.basename(os.path.dirname(s)) == "upstream":
            continue   # upstream/gpu.sh names vLLM's own test files
        for name in set(re.findall(r"\b([A-Za-z_][\w-]*\.(?:sh|py))\b", open(s).read())):
            if name in ("build_bundle.sh", "metrics.py", "stats.py", "envs.py", "batch_invariant.py",
                        "registry.py", "cuda.py"):
                continue  # in ../shared or in vLLM
            where = (EXP, os.path.dirname(s), os.path.join(EXP, "pdtools"), os.path.join(EXP, "cpu"),
                     os.path.join(ROOT, "tests", "harness"), os.path.join(EXP, "probes"), ROOT)
            assert any(os.path.exists(os.path.join(d, name)) for d in where), (os.path.basename(s), name)


def test_the_main_job_does_not_reach_into_tests():
    """experiments/ is what an operator runs; tests/ may use it, never the other way round
    (main.sh once ran tests/compat/mkenv.sh and tests/compat/pd_harness.py).  The one exception is
    the CPU harness, tests/harness/, which the lab's CPU checks run through pdtools (job_main,
    cpuchecks) and its drivers in cpu/: shared infrastructure, no test suite."""
    import re
    for s in SCRIPTS:
        for n, line in enumerate(open(s), 1):
            assert not re.search(r"(?<![\w/.-])tests/(compat|real|unit|experiments|activation|run\.sh)\b", line), (
                "%s:%d reaches into tests/: %s" % (os.path.relpath(s, ROOT), n, line.strip()))


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_port_checks():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    busy = srv.getsockname()[1]
    try:
        assert pair.port_in_use(busy) and not pair.port_in_use(_free_port())
        with pytest.raises(settings.LabExit) as e:
            pair.require_ports_free(_free_port(), busy)
        assert e.value.code == 2 and ("port %d is in use" % busy) in e.value.message
    finally:
        srv.close()


def _env(tmp_path, **extra):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "hidden_size": 1024, "torch_dtype": "bfloat16"}))
    base = 18000 + (os.getpid() % 900) * 1  # avoid clashes between parallel sessions
    e = dict(os.environ)
    e.update(PATH=os.path.join(HERE, "fake_bin") + os.pathsep + e["PATH"], SITE=os.path.join(HERE, "fake_vllm"),
             SHIM_PATH=str(tmp_path / "no-shim"), SHIM_CHECK="0", PY=sys.executable, MODEL=str(model),
             WORK=str(tmp_path / "work"), RESULT_DIR=str(tmp_path / "results"), VLLM_LOG_STATS_INTERVAL="0.2",
             PORT_PROXY=str(base), PORT_P=str(base + 1000), PORT_D=str(base + 1100),
             SIDE_P=str(base + 1200), SIDE_D=str(base + 1300), READY_TIMEOUT="60", KV_WAIT="20")
    e.pop("ENABLE_XLKV", None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def test_no_gpu_runs_cpu_checks_with_distinct_exit_code(tmp_path):
    e = _env(tmp_path, CPU_CHECKS_CMD="echo cpu-checks-ran")
    e["PATH"] = "/usr/bin:/bin"  # no nvidia-smi (fake or real)
    if any(os.path.exists(os.path.join(d, "nvidia-smi")) for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has nvidia-smi in /usr/bin")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert "no GPU on this machine: running CPU checks only" in r.stderr
    assert "cpu-checks-ran" in r.stdout
    assert r.returncode == 3
    e["CPU_CHECKS_CMD"] = "exit 1"
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 1 and "CPU checks failed" in r.stderr


FAKE_HARNESS_PY = r"""#!/bin/bash
# a harness Python for the CPU checks: pip and status answer, the harness writes a result
echo "$*" >> "$FAKE_PY_LOG"
case "$1 $2" in "-m pip") exit 0 ;; "-m xlkv_autopatch") echo "fake status"; exit 0 ;; esac
out=""
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
descs=4
[ -n "${ENABLE_XLKV:-}" ] && descs=${FAKE_XLKV_DESCS:-1}
printf '{"vllm": "0.99.0", "cross_layer": true, "num_regions": 1, "descs_per_block": %s, "transfer_verified": true, "errors": []}' "$descs" > "$out"
"""


def test_main_job_and_the_gpu_scripts_run_one_cpu_check(tmp_path):
    """Without a GPU, main.sh and the GPU scripts run the same checks (pdtools/cpuchecks.py): status,
    the harness stock and with ENABLE_XLKV=true, and the table that wants fewer descriptors."""
    if any(os.path.exists(os.path.join(d, "nvidia-smi")) for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has nvidia-smi in /usr/bin")
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_HARNESS_PY)
    fake.chmod(0o755)
    calls = tmp_path / "calls.log"
    e = _env(tmp_path, XLKV_HARNESS_PYTHON=str(fake), XLKV_MAIN_OUT=str(tmp_path / "main"), FAKE_PY_LOG=str(calls))
    e["PATH"] = "/usr/bin:/bin"  # no nvidia-smi (fake or real)
    main = subprocess.run(["bash", os.path.join(EXP, "main.sh")], capture_output=True, text=True, env=e, timeout=120)
    assert main.returncode == 0, main.stdout + main.stderr
    assert "no GPU on this machine: the GPU equivalence and TTFT benchmark" in main.stdout
    table = main.stdout[main.stdout.index("--- P->D transfer, stock"):]
    assert "descriptors per block: stock 4 -> xlkv 1 (OK)" in table and "CPU checks: PASS" in table
    harness = [line for line in calls.read_text().splitlines() if "pd_harness.py" in line]
    assert [line.split()[0] for line in harness] == [os.path.join(ROOT, "tests", "harness", "pd_harness.py")] * 2
    eq = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                        timeout=120)
    assert eq.returncode == 3, eq.stdout + eq.stderr
    assert "no GPU on this machine: running CPU checks only" in eq.stderr
    assert eq.stdout[eq.stdout.index("--- P->D transfer, stock"):] == table
    assert json.loads((tmp_path / "work" / "cpu-xlkv.json").read_text())["descs_per_block"] == 1
    e["FAKE_XLKV_DESCS"] = "4"  # the shim changed nothing: both fail
    main = subprocess.run(["bash", os.path.join(EXP, "main.sh")], capture_output=True, text=True, env=e, timeout=120)
    assert main.returncode == 1 and "stock 4 -> xlkv 4 (NOT fewer)" in main.stdout
    eq = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                        timeout=120)
    assert eq.returncode == 1 and "CPU checks failed" in eq.stderr
    # one copy: the harness runs and the table live in pdtools/cpuchecks.py only
    lab = SCRIPTS + glob.glob(os.path.join(EXP, "*.py")) + glob.glob(os.path.join(EXP, "pdtools", "*.py"))
    copies = [s for s in lab if any(m in open(s).read() for m in ("--- P->D transfer", "descriptors per block: stock"))]
    assert [os.path.basename(s) for s in copies] == ["cpuchecks.py"]

def test_vllm_missing_is_a_setup_error(tmp_path):
    e = _env(tmp_path, SITE=str(tmp_path / "empty-site"))
    e["PYTHONPATH"] = ""
    r = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, env=e)
    if r.returncode == 0:
        pytest.skip("a real vLLM is importable here")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 2 and "vLLM is not importable" in r.stderr


def test_batch_invariant_insisted_on_a_release_without_it_is_a_setup_error(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(os.path.join(HERE, "fake_vllm"), site)
    os.remove(site / "vllm" / "envs.py")          # this "release" does not know the variable
    e = _env(tmp_path, SITE=str(site), EQ_BATCH_INVARIANT="1", EQ_CONFIGS="stock")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "does not know VLLM_BATCH_INVARIANT" in r.stderr and "EQ_BATCH_INVARIANT=0" in r.stderr
    e["EQ_BATCH_INVARIANT"] = "maybe"
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 2 and "must be auto, 0 or 1" in r.stderr


aiohttp_needed = pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import aiohttp"]).returncode != 0,
                                    reason="aiohttp missing (the proxy and the fake vLLM need it)")


@aiohttp_needed
def test_equivalence_after_a_fragmenting_load_with_fake_vllm(tmp_path):
    """EQ_FRAGMENT: the churning load goes through the proxy after every pair start, before
    the checked prompts (negative control's restarted D included), and the summary says so."""
    e = _env(tmp_path, EQ_CONFIGS="shim", EQ_LENGTHS="5,100", EQ_FRAGMENT="6", FRAG_LEN="40",
             EQ_NEGATIVE_CONTROL="shim", EQ_JSON=str(tmp_path / "eq.json"))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert s["fragment_prompts"] == 6
    # the checked prompts are equivalent, and the planted corruption after the load is detected
    assert s["pass"] is True and s["equivalence_pass"] is True and s["negative_control_pass"] is True, s
    assert [x["label"] for x in s["runs"]] == ["local:shim", "pd:shim", "pd:nc-shim"]
    assert r.stderr.count("fragmenting the free block queues: 6 prompts") == 2, r.stderr[-3000:]
    work = tmp_path / "work"
    for cfg, checked in (("shim", ("eq-local-shim.json", "eq-pd-shim.json")), ("nc-shim", ("eq-pd-nc-shim.json",))):
        frag = work / ("eq-fragment-%s.log" % cfg)
        assert "Successful requests: 6" in frag.read_text(), frag.read_text()[-1000:]  # all 6 went through
        # the load had finished (its log's last write) before the first checked prompt was sent:
        # a run's file is written when its last answer is in, its requests took sum(seconds)
        first = work / checked[0]
        started = first.stat().st_mtime - sum(x["seconds"] for x in json.loads(first.read_text())["results"])
        assert frag.stat().st_mtime <= started + 0.05, (cfg, frag.stat().st_mtime, started)


@aiohttp_needed
@pytest.mark.slow
def test_equivalence_end_to_end_with_fake_vllm(tmp_path):
    e = _env(tmp_path, EQ_CONFIGS="stock shim", EQ_LENGTHS="5,100,4097", EQ_JSON=str(tmp_path / "eq.json"))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert s["equivalence_pass"] and s["descriptor_pass"] and s["pass"]
    assert [x["label"] for x in s["runs"]] == ["local:stock", "pd:stock", "local:shim", "pd:shim"]
    assert s["configs"]["stock"]["descriptors_per_block"] == pytest.approx(56)
    assert s["configs"]["shim"]["descriptors_per_block"] == pytest.approx(1)
    assert s["configs"]["shim"]["blocks_per_transfer"] == pytest.approx(100)  # PROBE_LEN 1600 / 16
    assert s["vllm_version"] == "0.21.0" and s["gpu"] == "2xH200"
    assert s["cuda_graphs"] is False  # --enforce-eager, the default (ENFORCE_EAGER=0 records true)
    assert "IDENTICAL" in r.stdout and "=> PASS" in r.stdout
    # EQ_BATCH_INVARIANT=auto: the (fake) release knows the variable, so every server got it
    assert s["batch_invariant"] is True and "VLLM_BATCH_INVARIANT=1 (deterministic)" in r.stdout
    # logprobs compared (identical here), every P/D answer moved KV, distinct ids recorded
    assert s["logprob_pass"] is True and s["transfers_pass"] is True
    assert s["configs"]["stock"]["max_logprob_diff"] == 0.0 and s["configs"]["shim"]["max_logprob_diff"] == 0.0
    assert s["configs"]["shim"]["kv_blocks_per_prompt"] == {"5": 1.0, "100": 7.0, "4097": 257.0}
    assert set(s["distinct_ids"]) == {"5", "100", "4097"}
    assert s["negative_control"] == [] and s["negative_control_pass"] is None
    local = json.loads((tmp_path / "work" / "eq-local-stock.json").read_text())["results"]
    assert len(local[0]["top_logprobs"][0]) == 5 and "kv" not in local[0]
    for f in ("eq-stock-p.log", "eq-stock-d.log", "eq-shim-p.log", "eq-shim-d.log"):
        assert "VLLM_BATCH_INVARIANT=1" in (tmp_path / "work" / f).read_text(), f
    # servers are gone afterwards
    assert not pair.port_in_use(e["PORT_P"]) and not pair.port_in_use(e["PORT_D"])


@aiohttp_needed
@pytest.mark.slow
def test_equivalence_detects_differences_and_too_many_descriptors(tmp_path):
    e = _env(tmp_path, EQ_CONFIGS="stock shim", EQ_LENGTHS="5,100", EQ_JSON=str(tmp_path / "eq.json"),
             FAKE_PD_CORRUPT="1", FAKE_SHIM_DESC="2")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert not s["equivalence_pass"] and s["descriptor_pass"] is False
    assert any(m.startswith("pd:stock") for m in s["mismatches"])
    assert "DIFFERENT" in r.stdout and "FAIL" in r.stdout


@aiohttp_needed
@pytest.mark.slow
def test_negative_controls_end_to_end_with_fake_vllm(tmp_path):
    """EQ_NEGATIVE_CONTROL=stock,shim: the hook's sitecustomize.py is loaded in D only (the fake
    server then shifts the logprobs of P/D answers, ids unchanged), and both controls must be
    detected: by the logprobs alone here."""
    e = _env(tmp_path, EQ_CONFIGS="stock shim", EQ_LENGTHS="5,100", EQ_NEGATIVE_CONTROL="stock,shim",
             EQ_NC_LENGTHS="100", EQ_JSON=str(tmp_path / "eq.json"))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert [x["label"] for x in s["runs"]] == ["local:stock", "pd:stock", "pd:nc-stock", "local:shim", "pd:shim",
                                               "pd:nc-shim"]
    assert s["equivalence_pass"] and s["pass"] and s["negative_control_pass"] is True
    nc = {n["config"]: n for n in s["negative_control"]}
    assert set(nc) == {"nc-stock", "nc-shim"}
    for n in nc.values():
        assert n["detected"] is True and n["ids_differ"] is False
        assert n["max_logprob_diff"] == pytest.approx(1e-3) and n["corruption"].startswith("shift: ")
    assert s["transfers"]["pd:nc-shim"]["100"]["transfers"] == 1
    work = tmp_path / "work"
    for cfg in ("nc-stock", "nc-shim"):
        assert "xlkv negative control: armed (shift)" in (work / ("eq-%s-d.log" % cfg)).read_text()
        assert "restarting D as %s (P kept)" % cfg in r.stderr  # P of its own config serves it
        assert not (work / ("eq-%s-p.log" % cfg)).exists()
    for cfg in ("stock", "shim"):
        assert "negative control" not in (work / ("eq-%s-d.log" % cfg)).read_text()
        assert "negative control" not in (work / ("eq-%s-p.log" % cfg)).read_text()
    assert "FAIL as planted: detected" in r.stdout


@aiohttp_needed
@pytest.mark.slow
def test_an_answer_that_moved_no_kv_fails(tmp_path):
    e = _env(tmp_path, EQ_CONFIGS="stock", EQ_LENGTHS="5,100", EQ_JSON=str(tmp_path / "eq.json"),
             FAKE_NO_TRANSFER="1", EQ_KV_WAIT="1", KV_WAIT="2")  # no metrics line will come
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert s["equivalence_pass"] is True and s["transfers_pass"] is False and s["pass"] is False
    assert s["transfer_problems"] == ["pd:stock len 5: D pulled no KV (transfers 0, bytes 0)",
                                      "pd:stock len 100: D pulled no KV (transfers 0, bytes 0)"]
    assert "NO TRANSFER" in r.stdout


@aiohttp_needed
@pytest.mark.slow
def test_bench_end_to_end_with_fake_vllm(tmp_path):
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="stock native", INPUT_LENS="64", NUM_PROMPTS="6", REPS="2", WARMUP_PROMPTS="1",
             RESULT_JSON=str(res))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = json.loads(res.read_text())
    assert d["vllm_version"] == "0.21.0" and d["gpu"] == "2xH200"
    cells = {c["config"]: c for c in d["cells"]}
    assert set(cells) == {"stock", "native"}
    for c in cells.values():
        assert c["input_len"] == 64 and c["num_prompts"] == 6 and c["reps"] == 2
        assert len(c["mean_ttft_ms"]) == 2 and all(x > 0 for x in c["mean_ttft_ms"])
        assert c["kv_xfer"]["num_transfers"] == [6, 6]  # one transfer per prompt, warm-up excluded
        assert any("bench serve" in x for x in c["commands"])
    assert cells["stock"]["descriptors_per_block"] == pytest.approx(56)
    assert cells["native"]["descriptors_per_block"] == pytest.approx(1)
    assert os.path.exists(str(res)[:-5] + ".md")


def test_bench_prefill_only_and_fragmented_state_with_fake_vllm(tmp_path):
    pytest.importorskip("aiohttp", reason="the proxy and the fake vLLM need it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="prefill_only stock", INPUT_LENS="64", NUM_PROMPTS="4", REPS="1",
             WARMUP_PROMPTS="1", BENCH_STATE="fragmented", FRAG_PROMPTS="5", FRAG_LEN="32", RESULT_JSON=str(res))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "fragmenting the free block queue: 5 prompts" in r.stderr
    cells = {c["config"]: c for c in json.loads(res.read_text())["cells"]}
    assert {c["state"] for c in cells.values()} == {"fragmented"}
    alone, stock = cells["prefill_only"], cells["stock"]
    assert alone["output_len"] == 1 and stock["output_len"] == 16
    assert alone["kv_xfer"]["num_transfers"] == [None]  # P alone: nothing moved, nothing counted
    assert stock["kv_xfer"]["num_transfers"] == [4]  # the measured prompts only, not the fragmenting load
    # the proxy's split of each repetition: 4 requests, P's answer and D's first byte
    assert alone["proxy_prefill_ms"] == [None]
    assert len(stock["proxy_prefill_ms"]) == 1 and stock["proxy_prefill_ms"][0] > 0
    assert stock["proxy_decode_first_ms"][0] > 0
    cmds = " ".join(alone["commands"])
    assert "--base-url http://127.0.0.1:%s" % e["PORT_P"] in cmds and "D[" not in cmds
    md = open(str(res)[:-5] + ".md").read()
    assert "P/D overhead" in md and "stock [fragmented]" in md
    assert "Where the P/D TTFT goes" in md and "stock [fragmented]: P's answer" in md


def test_prefill_alone_with_the_detok_switch_starts_p_alone_with_it(tmp_path, monkeypatch):
    """prefill_only-detok: P alone, max_tokens=1, with the shim and XLKV_DETOK_TAIL=true, the prefill alone
    the configs with that switch are compared with; prefill_only stays stock."""
    monkeypatch.setenv("SHIM_CHECK", "0")
    pytest.importorskip("aiohttp", reason="the proxy and the fake vLLM need it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="prefill_only-detok prefill_only", INPUT_LENS="32", NUM_PROMPTS="2", REPS="1",
             WARMUP_PROMPTS="1", RESULT_JSON=str(res), SHIM_CHECK="0")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cells = {c["config"]: c for c in json.loads(res.read_text())["cells"]}
    for name, switch in (("prefill_only-detok", True), ("prefill_only", False)):
        c = cells[name]
        assert c["output_len"] == 1 and c["kv_xfer"]["num_transfers"] == [None], c
        [p] = [x for x in c["commands"] if x.startswith("P[")]
        assert not [x for x in c["commands"] if x.startswith("D[")], c["commands"]
        assert ("ENABLE_XLKV=true XLKV_DETOK_TAIL=true" in p) is switch, p


def test_bench_concurrency_levels_are_cells_of_their_own_on_the_same_servers_with_the_handoff_trace(tmp_path):
    """CONCURRENCY: one cell per level (the client's --max-concurrency), fresh seeds per level (no prompt
    repeats across levels), servers started once per config; HANDOFF_TRACE=1: P and D get the trace hook
    and the proxy writes its per-request times (the fake vLLM has no NixlConnector: no engine lines)."""
    pytest.importorskip("aiohttp", reason="the proxy and the fake vLLM need it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="prefill_only stock", INPUT_LENS="64 32", NUM_PROMPTS="3", REPS="1",
             WARMUP_PROMPTS="1", CONCURRENCY="1 2", HANDOFF_TRACE="1", RESULT_JSON=str(res))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    every = json.loads(res.read_text())["cells"]
    cells = {(c["config"], c["max_concurrency"]): c for c in every if c["input_len"] == 64}
    assert set(cells) == {(cfg, c) for cfg in ("prefill_only", "stock") for c in (1, 2)}
    seeds = set()
    for cell in every:  # a seed per length, level and rep: a shorter prompt is never the prefix of a measured one
        c, i = cell["max_concurrency"], [64, 32].index(cell["input_len"])
        cmds = [x for x in cell["commands"] if "bench serve" in x and "--seed 99 " not in x
                and "--random-input-len %d " % cell["input_len"] in x and "--max-concurrency %d" % c in x]
        seed = 1001 + 10000 * i + 100 * (c - 1)
        assert len(cmds) == 1 and ("--seed %d " % seed) in cmds[0], cmds
        seeds.add((cell["config"], seed))
    assert len(seeds) == 8
    assert r.stderr.count("start P[stock]") == 1  # both levels on one pair
    work = tmp_path / "work"
    p_cmd = [x for x in (work / "commands.txt").read_text().splitlines() if x.startswith("P[stock]")]
    assert "XLKV_TRACE_HANDOFF=%s" % (work / "bench-stock-trace") in p_cmd[0] and "negative_control" in p_cmd[0]
    assert "--enforce-eager" in p_cmd[0]      # the default (ENFORCE_EAGER unset)
    proxy = [json.loads(x) for x in (work / "bench-stock-trace" / "proxy.jsonl").read_text().splitlines()]
    assert len(proxy) == 2 * (1 + 3 + 3)  # per length: the warm-up and both levels
    assert [h["requests"] for h in cells[("stock", 1)]["handoff_trace"]] == [0]  # no engine lines: no D rows
    assert cells[("prefill_only", 1)]["handoff_trace"] == [None]
    md = open(str(res)[:-5] + ".md").read()
    assert "stock [c1]" in md and "stock [c2]" in md


@pytest.mark.parametrize("client", ["resident", "cli"])
def test_bench_runs_every_repetition_in_one_resident_client(tmp_path, client):
    """The benchmark client is imported once per job (experiments/bench_client.py; 20-30 s of imports per
    repetition on 2 x H200 before): every repetition and the warm-up ran in one process, through vLLM's
    own benchmark module (the fake's here); BENCH_CLIENT=cli: a process per run, as before."""
    pytest.importorskip("aiohttp", reason="the fake vLLM needs it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="prefill_only", INPUT_LENS="64 32", NUM_PROMPTS="3", REPS="2", WARMUP_PROMPTS="1",
             BENCH_CLIENT=client, RESULT_JSON=str(res))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = [json.loads(f.read_text()) for f in sorted((tmp_path / "work" / "bench").glob("*.json"))]
    assert len(runs) == 4 and all(x["completed"] == 3 for x in runs)
    pids = {x["client_pid"] for x in runs}
    assert len(pids) == (1 if client == "resident" else 4), pids
    cells = json.loads(res.read_text())["cells"]
    assert sorted(c["input_len"] for c in cells) == [32, 64] and all(len(c["mean_ttft_ms"]) == 2 for c in cells)


def test_bench_client_survives_a_failed_repetition(tmp_path):
    """A repetition that fails (no server) is reported as failed, the next one runs in the same process."""
    pytest.importorskip("aiohttp", reason="the fake vLLM needs it")
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "fake_vllm"))
    bench = pair.BenchClient(sys.executable, str(tmp_path), env, mode="resident")
    try:
        argv = ["--base-url", "http://127.0.0.1:9", "--model", "m", "--random-input-len", "4",
                "--random-output-len", "1", "--num-prompts", "1"]
        assert bench.run(argv, str(tmp_path / "a.log"), 60) is False
        pid = bench.proc.pid
        assert bench.run(argv + ["--no-such-option"], str(tmp_path / "b.log"), 60) is False
        assert bench.proc.pid == pid and bench.proc.poll() is None
        assert "unrecognized arguments: --no-such-option" in (tmp_path / "b.log").read_text()
    finally:
        bench.close()


def test_bench_on_one_gpu_turns_cuda_ipc_reads_on_and_refuses_without_them(tmp_path):
    """One GPU: UCX turns cuda_ipc READs off without NVLink (0.4 GB/s measured), so the servers
    get UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (1292 GB/s measured) and the cells say shared_gpu; a caller
    who sets it to n gets the refusal before any server starts; prefill_only (P alone) still runs."""
    pytest.importorskip("aiohttp", reason="the fake vLLM needs it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, FAKE_NGPU="1", CONFIGS="prefill_only shim", INPUT_LENS="64", NUM_PROMPTS="2",
             REPS="1", WARMUP_PROMPTS="0", RESULT_JSON=str(res), UCX_CUDA_IPC_ENABLE_GET_ZCOPY="n")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "config shim needs 2 GPUs" in r.stderr and "BENCH_ALLOW_SHARED_GPU=1" in r.stderr
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n" in r.stderr
    assert "start P[" not in r.stderr and not res.exists()  # refused before any server started
    del e["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"]
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "shared GPU: UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in r.stderr
    doc = json.loads(res.read_text())
    assert [c["config"] for c in doc["cells"]] == ["prefill_only", "shim"]
    assert doc["gpu"] == "1xH200"
    for c in doc["cells"]:
        assert c["shared_gpu"] is True and c["ucx_cuda_ipc_get_zcopy"] == "y", c


def test_main_job_on_one_gpu_runs_the_equivalence_and_skips_the_benchmark_saying_why(tmp_path):
    pytest.importorskip("aiohttp", reason="the proxy and the fake vLLM need it")
    e = _env(tmp_path, FAKE_NGPU="1", EQ_CONFIGS="stock shim", EQ_LENGTHS="5,100",
             XLKV_MAIN_OUT=str(tmp_path / "main"), CONFIGS="shim")
    r = subprocess.run(["bash", os.path.join(EXP, "main.sh")], capture_output=True, text=True, env=e,
                       timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "main" / "equivalence.json").read_text())
    assert s["pass"] and s["gpu"] == "1xH200"
    assert "the TTFT benchmark" in r.stdout and "is skipped" in r.stdout
    assert "=== shim (fresh) ===" not in r.stderr  # pd_bench.sh never started a pair


def test_run_gpu_cell_returns_its_console_even_when_timeout_stops_it(tmp_path):
    """`timeout` signals the whole process group, tee included; the trap must still copy the
    console and the log extracts into $OUT (a device call returns only what is there)."""
    import signal
    import time
    fake = tmp_path / "bin"
    fake.mkdir()
    hung = tmp_path / "status-step-running"
    (fake / "nvidia-smi").write_text("#!/bin/sh\ntouch %s\nsleep 30\n" % hung)   # the status step hangs
    (fake / "nvidia-smi").chmod(0o755)
    e = dict(os.environ, PATH=str(fake) + os.pathsep + os.environ["PATH"], OUT=str(tmp_path / "out"),
             WORK=str(tmp_path / "work"), RESULT_DIR=str(tmp_path / "res"))
    # timeout's own timer fires (SIGALRM) once the step hangs, however long a loaded machine took to get
    # there (a fixed `timeout 3` fired before the step began under load)
    p = subprocess.Popen(["timeout", "300", "bash", os.path.join(EXP, "run_gpu_cell.sh"), "status"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    deadline = time.time() + 120
    while not hung.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
    assert hung.exists(), "the status step never reached nvidia-smi"
    os.kill(p.pid, signal.SIGALRM)
    stdout, _ = p.communicate(timeout=120)
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, "")
    assert r.returncode == 124
    out = tmp_path / "out"
    assert {"console.txt", "loggrep.txt", "logtails.txt"} <= set(os.listdir(out))
    console = (out / "console.txt").read_text()
    assert "===== step: status" in console and "stopped with exit 143" in console
    assert "run_gpu_cell: exit 143" in r.stdout


def test_run_gpu_cell_bench_succeeds_without_a_wire_file(tmp_path):
    """the bench step looks for the wire step's file; with none (one GPU: no wire step) a
    finished benchmark must not end the call with exit 2 (seen 2026-11-24: pipefail on `ls`)"""
    pytest.importorskip("aiohttp", reason="the fake vLLM needs it")
    e = _env(tmp_path, FAKE_NGPU="1", CONFIGS="prefill_only", INPUT_LENS="64", NUM_PROMPTS="2", REPS="1",
             WARMUP_PROMPTS="0", OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", os.path.join(EXP, "run_gpu_cell.sh"), "bench"], capture_output=True, text=True,
                       env=e, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "run_gpu_cell: exit 0" in r.stdout and not glob.glob(str(tmp_path / "results" / "wire-*"))


def test_run_gpu_cell_returns_only_the_staged_releases_results(tmp_path):
    """With two releases staged on one machine, only the results of the one in $SITE go to
    $OUT (the device tool returns a limited number of files; the logs must fit)."""
    site = tmp_path / "site"
    dist = site / "vllm-0.26.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    res = tmp_path / "res"
    res.mkdir()
    names = ["2026-11-22-0.21.0-2xH200.json", "2026-11-22-0.21.0-2xH200.md", "equivalence-0.21.0.json",
             "2026-11-22-0.26.0-2xH200.json", "2026-11-22-0.26.0-2xH200.png", "equivalence-0.26.0.json",
             "2026-11-22-0.26.0.1-2xH200.json"]
    for n in names:
        (res / n).write_text("{}")
    e = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), RESULT_DIR=str(res),
             SITE=str(site))
    r = subprocess.run(["bash", os.path.join(EXP, "run_gpu_cell.sh"), "no-such-step"],
                       capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 2
    got = set(os.listdir(tmp_path / "out")) - {"console.txt", "loggrep.txt", "logtails.txt"}
    assert got == {"2026-11-22-0.26.0-2xH200.json", "2026-11-22-0.26.0-2xH200.png", "equivalence-0.26.0.json"}
    assert "kept on the machine (not vLLM 0.26.0): 2026-11-22-0.21.0-2xH200.json" in r.stdout
    # nothing staged: everything comes back, as before
    e["SITE"] = str(tmp_path / "empty")
    e["OUT"] = str(tmp_path / "out2")
    subprocess.run(["bash", os.path.join(EXP, "run_gpu_cell.sh"), "no-such-step"], capture_output=True, env=e,
                   timeout=60)
    assert set(names) <= set(os.listdir(tmp_path / "out2"))


def test_run_gpu_cell_returns_an_eq_json_outside_the_result_dir(tmp_path):
    """EQ_JSON written outside RESULT_DIR comes back to $OUT too (it stayed on the machine in a lease)."""
    eq = tmp_path / "work-33" / "equivalence-0.33.0-1xH200-detok-nc.json"
    eq.parent.mkdir()
    eq.write_text("{}")
    e = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), RESULT_DIR=str(tmp_path / "res"),
             SITE=str(tmp_path / "empty"), EQ_JSON=str(eq))
    r = subprocess.run(["bash", os.path.join(EXP, "run_gpu_cell.sh"), "no-such-step"],
                       capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 2
    assert eq.name in os.listdir(tmp_path / "out"), r.stdout


def test_shim_ablation_and_ray_configs(monkeypatch):
    env, _, d_env, d_args, _ = _cfg("shim-keep-order")
    assert (env, d_env, d_args) == ("ENABLE_XLKV=true XLKV_COALESCE=false", "", "")
    # the UCX lever: the shim plus NIXL's num_threads through kv_connector_extra_config (valid JSON)
    for threads, n in ((None, 8), ("16", 16)):
        if threads:
            monkeypatch.setenv("UCX_NUM_THREADS", threads)
        env, extra = _cfg("shim-ucx")[:2]
        assert env == "ENABLE_XLKV=true" and json.loads(extra) == {"num_threads": n}
    # D on Ray: the flag on both sides, copied into the Ray worker's environment, D's executor
    env, _, d_env, d_args, _ = _cfg("shim-ray")
    assert (env, d_env, d_args) == ("ENABLE_XLKV=true", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY=ENABLE_XLKV",
                                    "--distributed-executor-backend ray")
    # without ray importable (CI has none) the config is refused with the way to get it
    if subprocess.run([sys.executable, "-c", "import ray"], capture_output=True).returncode == 0:
        pytest.skip("ray is importable here")
    monkeypatch.setenv("SHIM_CHECK", "0")
    monkeypatch.setenv("PY", sys.executable)
    ok, why = _why("shim-ray", "0.29.0")
    assert not ok and "XLKV_BUNDLE_EXTRA=ray" in why
    assert _supported("shim-keep-order", "0.29.0")


def test_proxy_lever_config_and_the_removed_shim_levers(monkeypatch):
    """shim-ids is the shim plus the proxy's --token-ids-to-d (a proxy-side lever); the shim's handoff
    levers (shim-early, shim-notice, shim-levers, shim-all) were removed in 0.4.0 and are unknown configs."""
    monkeypatch.setenv("SHIM_CHECK", "0")
    env, _, _, _, proxy = _cfg("shim-ids")
    assert (env, proxy) == ("ENABLE_XLKV=true", "--token-ids-to-d")
    for version in ("0.26.0", "0.33.0"):
        assert _supported("shim-ids", version)
    for cfg in ("shim-early", "shim-notice", "shim-levers", "shim-all", "nc-shim-levers"):
        ok, why = _why(cfg, "0.33.0")
        assert not ok and "unknown config" in why, (cfg, why)
    assert "shim-early" not in open(configs.__file__).read()
    # the negative control of the proxy lever keeps it and corrupts D's KV
    monkeypatch.setenv("PYTHONPATH", "/site")
    env, _, d_env, _, proxy = _cfg("nc-shim-ids")
    assert env == "ENABLE_XLKV=true" and "XLKV_NEGATIVE_CONTROL" in d_env and proxy == "--token-ids-to-d"
    assert _cfg("stock")[4] == ""


# ------------------------------------------------------------------ model families ----
def _family_model(tmp_path, family):
    model = tmp_path / ("model-" + family)
    model.mkdir(exist_ok=True)
    cfg = {"mla": {"model_type": "deepseek_v2", "num_hidden_layers": 8, "num_attention_heads": 16,
                   "num_key_value_heads": 16, "hidden_size": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
           "sliding-window": {"model_type": "gemma3_text", "num_hidden_layers": 12, "num_attention_heads": 8,
                              "num_key_value_heads": 4, "head_dim": 256, "hidden_size": 2560, "sliding_window": 256,
                              "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2}}[family]
    (model / "config.json").write_text(json.dumps(cfg))
    return str(model)


def test_model_arch_picks_the_generated_models_folder_and_the_reference_needs_stock(tmp_path):
    assert pair.model_dir_for("qwen3") == "/tmp/xlkv-model"          # as before
    assert pair.model_dir_for("deepseek_v2") == "/tmp/xlkv-model-deepseek_v2"
    e = _env(tmp_path, MODEL=_family_model(tmp_path, "mla"), EQ_CONFIGS="shim")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 2 and "reference: pd-stock (EQ_REFERENCE=auto, a mla model)" in r.stderr, r.stderr[-2000:]
    assert "put stock in EQ_CONFIGS" in r.stderr
    e["EQ_REFERENCE"] = "nearby"
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 2 and "EQ_REFERENCE must be auto, local, pd-stock or pd-stock-v1" in r.stderr
    e.update(EQ_REFERENCE="pd-stock-v1", EQ_CONFIGS="stock shim")   # stock on V2 is not the V1 baseline
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=120)
    assert r.returncode == 2 and "put stock-v1 in EQ_CONFIGS" in r.stderr, r.stderr[-2000:]


@aiohttp_needed
@pytest.mark.slow
def test_mla_equivalence_against_stock_pd_with_registered_bytes(tmp_path):
    """An MLA model (DeepSeek-V2-shaped config): EQ_REFERENCE=auto compares with stock P/D, whose
    answers differ from local prefill here (FAKE_PD_CORRUPT: every P/D answer, stock too, as vLLM's
    own P/D did on 0.33.0); D's registration report gives 144 KiB per block, so the probe's 100
    blocks and the shim's 1 descriptor per block come out right; the negative control is detected
    against stock P/D."""
    mla_block = 16 * 8 * (512 + 64) * 2
    e = _env(tmp_path, MODEL=_family_model(tmp_path, "mla"), EQ_CONFIGS="stock shim", EQ_LENGTHS="5,100",
             EQ_NEGATIVE_CONTROL="shim", EQ_NC_LENGTHS="100", EQ_JSON=str(tmp_path / "eq.json"),
             FAKE_MLA="1", FAKE_BLOCK_BYTES=str(mla_block), FAKE_STOCK_DESC="8", FAKE_PD_CORRUPT="1")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert s["reference"] == "pd-stock" and s["model_family"] == "mla" and s["baseline"] == "pd:stock"
    assert s["pass"] and s["negative_control_pass"] is True and s["negative_control"][0]["compared_with"] == "pd:stock"
    assert set(s["local_vs_pd_stock"]) == {"local:stock", "local:shim"}          # vLLM's, recorded
    assert all(d["problems"] for d in s["local_vs_pd_stock"].values())
    shim, stock = s["configs"]["shim"], s["configs"]["stock"]
    assert shim["bytes_per_block"] == mla_block and shim["bytes_per_block_source"] == "registration"
    assert shim["blocks_per_transfer"] == pytest.approx(100) and shim["descriptors_per_block"] == pytest.approx(1)
    assert shim["limit"] == 1.0 and shim["attn_backend"] == "FLASH_ATTN_MLA"
    assert stock["descriptors_per_block"] == pytest.approx(8) and stock["registered_regions_per_block_id"] == [8]
    assert shim["kv_blocks_per_prompt"] == {"5": 1.0, "100": 7.0}
    assert "DIFFERENT (vLLM's)" in r.stdout and "recorded, not failing" in r.stdout
    # every D got the registration report (stock too), no P did; the controls' D has the hook once
    cmds = (tmp_path / "work" / "commands.txt").read_text().splitlines()
    d_lines = [l for l in cmds if l.startswith("D[")]
    assert len(d_lines) == 3 and all("XLKV_REGISTRATION_REPORT=" in l and "negative_control:" in l for l in d_lines)
    assert all(l.count("/negative_control:") == 1 for l in d_lines)
    assert not any("XLKV_REGISTRATION_REPORT" in l for l in cmds if l.startswith("P["))
    # planted: the old baseline (local prefill) fails on vLLM's own difference, and without D's
    # report an MLA model's blocks are unknown (never the dense formula's 1 MiB), so the check fails
    e.update(EQ_REFERENCE="local", REG_REPORT="0", EQ_NEGATIVE_CONTROL="", EQ_JSON=str(tmp_path / "eq2.json"))
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq2.json").read_text())
    assert s["equivalence_pass"] is False and s["descriptor_pass"] is False
    assert s["configs"]["shim"]["blocks_per_transfer"] is None and s["configs"]["shim"]["bytes_per_block"] == 0
    assert "no usable registration report from D for a mla model" in r.stderr


@aiohttp_needed
@pytest.mark.slow
def test_sliding_window_hybrid_descriptors_are_per_block_id(tmp_path):
    """6 KV cache groups (1 full, 5 sliding with a 17-block window): a P/D answer pulls the full
    group's blocks plus each sliding group's tail; descriptors per block id from the bytes D
    registered per block id."""
    e = _env(tmp_path, MODEL=_family_model(tmp_path, "sliding-window"), EQ_CONFIGS="stock shim",
             EQ_LENGTHS="5,1000", EQ_JSON=str(tmp_path / "eq.json"), FAKE_KV_GROUPS="6", FAKE_SHIM_DESC="1")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    # the package's names (files before 0.8.3 said "sliding-hybrid"), and the shape's axes beside the name
    assert s["reference"] == "pd-stock" and s["model_family"] == "sliding-window" and s["pass"]
    assert (s["model_shape"]["attention"], s["model_shape"]["kv_heads_per_rank"]) == ("sliding-window", 4)
    shim, stock = s["configs"]["shim"], s["configs"]["stock"]
    assert shim["kv_cache_groups"] == 6 and shim["bytes_per_block_source"] == "registration"
    # probe 1600 tokens: 100 + 5 * 17 block ids; 1000 tokens: 63 + 5 * 17
    assert shim["blocks_per_transfer"] == pytest.approx(185) and shim["descriptors_per_block"] == pytest.approx(1)
    assert stock["descriptors_per_block"] == pytest.approx(56)
    assert shim["kv_blocks_per_prompt"] == {"5": 6.0, "1000": 148.0}
    assert shim["kv"]["blocks_expected"] is None   # a prompt's length does not give a hybrid's blocks


def test_detok_config_sets_the_switch_on_p_and_d_and_cuda_graphs_on_request(tmp_path, monkeypatch):
    """shim-detok: the shim plus its XLKV_DETOK_TAIL switch on P and D (no lab hook: the switch is the
    package's); shim is unchanged.  ENFORCE_EAGER=0: the servers start without --enforce-eager (the default
    keeps it)."""
    monkeypatch.setenv("SHIM_CHECK", "0")
    assert _cfg("shim-detok")[0] == "ENABLE_XLKV=true XLKV_DETOK_TAIL=true"
    assert _cfg("shim")[0] == "ENABLE_XLKV=true"
    both = _cfg("shim-ids-detok")
    assert (both[0], both[4]) == ("ENABLE_XLKV=true XLKV_DETOK_TAIL=true", "--token-ids-to-d")
    pytest.importorskip("aiohttp", reason="the proxy and the fake vLLM need it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="shim-detok shim", INPUT_LENS="32", NUM_PROMPTS="2", REPS="1", WARMUP_PROMPTS="1",
             RESULT_JSON=str(res), SHIM_CHECK="0", ENFORCE_EAGER="0")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    cells = {c["config"]: c["commands"] for c in json.loads(res.read_text())["cells"]}
    servers = [x for cmds in cells.values() for x in cmds if x[:2] in ("P[", "D[")]
    assert len(servers) == 4 and not any("--enforce-eager" in x for x in servers), servers
    for side in ("P", "D"):
        [switch] = [x for x in cells["shim-detok"] if x.startswith("%s[shim-detok]" % side)]
        assert "XLKV_DETOK_TAIL=true" in switch and "ENABLE_XLKV=true" in switch, switch
        [plain] = [x for x in cells["shim"] if x.startswith("%s[shim]" % side)]
        assert "XLKV_DETOK_TAIL" not in plain, plain
    # P has no registration report and the switch needs no lab hook: no negative-control folder on P
    assert "negative_control" not in [x for x in cells["shim-detok"] if x.startswith("P[shim-detok]")][0]


def test_a_config_named_twice_alternates_and_its_cell_gains_repetitions(tmp_path):
    """The next lease alternates configs by naming them again (CONFIGS="stock shim stock", REPS=1): each name
    starts its own servers, in that order, and the repeated config's cell holds both repetitions."""
    pytest.importorskip("aiohttp", reason="the proxy and the fake vLLM need it")
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="stock shim stock", INPUT_LENS="32", NUM_PROMPTS="2", REPS="1", WARMUP_PROMPTS="1",
             RESULT_JSON=str(res), SHIM_CHECK="0")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    starts = re.findall(r"start P\[(\w+)\]", r.stderr)
    assert starts == ["stock", "shim", "stock"], starts
    cells = {c["config"]: c for c in json.loads(res.read_text())["cells"]}
    assert (cells["stock"]["reps"], cells["shim"]["reps"]) == (2, 1)
    assert len(set(cells["stock"]["run_ids"])) == 2


def _word_vocab(model):
    """The lab model's word tokenizer as far as the fake servers speak it: "w<k>" is id k."""
    (model / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"w%d" % k: k for k in range(32000)}},
                                                      "added_tokens": []}))
    (model / "tokenizer_config.json").write_text(json.dumps({}))


@aiohttp_needed
@pytest.mark.slow
def test_equivalence_through_dynamo_with_fake_dynamo(tmp_path):
    """dynamo-<config>: P and D as Dynamo workers behind its frontend (the fake package beside the fake vLLM),
    compared with the lab's local prefill of the first config; the ids read back through the vocabulary, the
    negative control through Dynamo detected, the descriptors counted from D's system port."""
    e = _env(tmp_path, EQ_CONFIGS="stock dynamo-stock dynamo-shim", EQ_LENGTHS="5,100",
             EQ_NEGATIVE_CONTROL="dynamo-shim", EQ_NC_LENGTHS="100", EQ_JSON=str(tmp_path / "eq.json"))
    _word_vocab(tmp_path / "model")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_equivalence.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "eq.json").read_text())
    assert [x["label"] for x in s["runs"]] == ["local:stock", "pd:stock", "pd:dynamo-stock", "pd:dynamo-shim",
                                               "pd:nc-dynamo-shim"]
    assert s["equivalence_pass"] and s["logprob_pass"] and s["pass"] and s["negative_control_pass"] is True
    assert s["configs"]["dynamo-stock"]["descriptors_per_block"] == pytest.approx(56)
    assert s["configs"]["dynamo-shim"]["descriptors_per_block"] == pytest.approx(1)
    assert s["descriptor_pass"] is True and s["configs"]["dynamo-shim"]["descriptor_pass"] is True
    work = tmp_path / "work"
    # judged again from the run files alone: the same verdict, said so in the file
    r2 = subprocess.run([sys.executable, os.path.join(EXP, "pdtools"), "resummarize", str(tmp_path / "eq.json"),
                         str(work)], capture_output=True, text=True, env=e, timeout=120)
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-2000:]
    s2 = json.loads((tmp_path / "eq.json").read_text())
    assert s2["pass"] and s2["resummarized"]["pass_before"] is True
    assert [x["label"] for x in s2["runs"]] == [x["label"] for x in s["runs"]]
    pd = json.loads((work / "eq-pd-dynamo-shim.json").read_text())["results"]
    assert {x["method"] for x in pd} == {"logprobs_tokens_vocab"} and all(x["kv"]["transfers"] == 1 for x in pd)
    assert "Prefill worker detected" in (work / "eq-dynamo-shim-proxy.log").read_text()
    for side, role in (("p", "prefill"), ("d", "decode")):
        assert "fake dynamo.vllm: %s worker" % role in (work / ("eq-dynamo-shim-%s.log" % side)).read_text()
    assert "xlkv negative control: armed" in (work / "eq-nc-dynamo-shim-d.log").read_text()
    assert json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())["chat_template"]
    folders = re.findall(r"Dynamo discovery folder (\S+)", r.stderr)
    assert len(folders) == 3 and not any(os.path.exists(f) for f in folders)   # one per pair, removed at its stop


@aiohttp_needed
@pytest.mark.slow
def test_bench_through_dynamo_keeps_the_frontends_histograms_per_repetition(tmp_path):
    res = tmp_path / "results" / "r.json"
    e = _env(tmp_path, CONFIGS="dynamo-shim-detok", INPUT_LENS="64", NUM_PROMPTS="4", REPS="2",
             WARMUP_PROMPTS="1", RESULT_JSON=str(res))
    _word_vocab(tmp_path / "model")
    r = subprocess.run(["bash", os.path.join(EXP, "pd_bench.sh")], capture_output=True, text=True, env=e,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (c,) = json.loads(res.read_text())["cells"]
    assert c["config"] == "dynamo-shim-detok" and c["reps"] == 2 and c["kv_xfer"]["num_transfers"] == [4, 4]
    assert c["descriptors_per_block"] == pytest.approx(1)
    for rep in c["frontend"]:
        assert rep["dynamo_frontend_time_to_first_token_seconds"]["n"] == 4
        assert rep["dynamo_frontend_time_to_first_token_seconds"]["mean_ms"] > 0
    assert "GET timings failed" not in r.stderr
