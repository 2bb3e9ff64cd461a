"""docs/deploy.md and deploy/ say what the package and its command line are: the README links
the guide, every knob they name is one of flag.py's, the commands they give exist, both
Kubernetes Deployments set the flag, and the image layer sets nothing."""

import os
import re
import subprocess
import sys

import yaml  # a dependency of transformers (tests/requirements.txt)

from xlkv_autopatch import flag

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


GUIDE = _read("docs", "deploy.md")
DOCKERFILE = _read("deploy", "Dockerfile")
MANIFEST = _read("deploy", "pd.yaml")
KNOWN = {k.name for k in flag.KNOBS} | {"XLKV_VLLM_VERSION"}


def test_readme_quick_start_links_the_guide():
    quick = _read("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "docs/deploy.md" in quick


def test_every_knob_named_is_a_knob():
    for name, text in (("deploy.md", GUIDE), ("Dockerfile", DOCKERFILE), ("pd.yaml", MANIFEST)):
        named = set(re.findall(r"\b(ENABLE_XLKV|XLKV_[A-Z_]+)\b", text)) - {"XLKV_"}
        assert named and named <= KNOWN, (name, named - KNOWN)


def test_the_status_command_it_gives_exists():
    assert "python3 -m xlkv_autopatch status --json" in GUIDE
    r = subprocess.run([sys.executable, "-m", "xlkv_autopatch", "status", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--json" in r.stdout, r.stdout + r.stderr


def test_linked_files_exist():
    for target in re.findall(r"\]\(([^)#]+)\)", GUIDE):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, "docs", target)), target


def manifest_problems(text):
    """What is wrong with a P/D manifest: each Deployment must set ENABLE_XLKV=true and
    advertise its pod IP as the NIXL side-channel host."""
    problems = []
    deployments = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "Deployment"]
    if len(deployments) != 2:
        problems.append("%d Deployments, 2 expected" % len(deployments))
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            if flag.knob_state(flag.FLAG, {k: e.get("value") for k, e in env.items()}) != "on":
                problems.append("%s: ENABLE_XLKV not on" % d["metadata"]["name"])
            host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", {}).get("valueFrom", {})
            if host.get("fieldRef", {}).get("fieldPath") != "status.podIP":
                problems.append("%s: VLLM_NIXL_SIDE_CHANNEL_HOST is not the pod IP" % d["metadata"]["name"])
    return problems


def test_both_deployments_set_the_flag_and_their_address():
    assert manifest_problems(MANIFEST) == []


def test_the_manifest_check_sees_a_decode_without_the_flag():
    # planted: the decode Deployment's flag off, then its side-channel host left at vLLM's default
    second = MANIFEST.index("name: vllm-decode")
    off = MANIFEST[:second] + MANIFEST[second:].replace('{name: ENABLE_XLKV, value: "true"}',
                                                         '{name: ENABLE_XLKV, value: "false"}', 1)
    assert manifest_problems(off) == ["vllm-decode: ENABLE_XLKV not on"]
    local = MANIFEST[:second] + MANIFEST[second:].replace("fieldPath: status.podIP", "fieldPath: status.hostIP", 1)
    assert manifest_problems(local) == ["vllm-decode: VLLM_NIXL_SIDE_CHANNEL_HOST is not the pod IP"]


def test_the_image_layer_installs_the_wheel_and_sets_nothing():
    name = re.search(r"^name = (\S+)", _read("setup.cfg"), re.M).group(1)
    assert re.search(r"^COPY %s-\*\.whl " % name, DOCKERFILE, re.M), DOCKERFILE
    assert re.search(r"^FROM vllm/vllm-openai:", DOCKERFILE, re.M)
    assert not re.search(r"^\s*ENV\s", DOCKERFILE, re.M), "the layer must set no environment"
    assert "ENABLE_XLKV=true python3 -m xlkv_autopatch status" in DOCKERFILE  # the build-time check


def test_deploy_names_no_wheel_version_or_size_it_does_not_derive():
    """Issue 43 item 6: docs/deploy.md named a wheel of 0.3.12 (76 KB) long after; a version or a size typed
    into the text goes stale, so the text names none."""
    text = open(os.path.join(ROOT, "docs", "deploy.md")).read()
    assert not re.search(r"xlkv_autopatch-\d+\.\d+\.\d+-py3", text), "a typed wheel version in docs/deploy.md"
    assert not re.search(r"\.whl`? \(\d+ KB\)", text), "a typed wheel size in docs/deploy.md"
