"""docs/deploy.md and deploy/ say what the package and its command line are: the README links
the guide, every knob they name is one of flag.py's, the commands they give exist, both
Kubernetes Deployments set the flag (and have a RAM-backed /dev/shm, a model cache, a startupProbe and
the app.kubernetes.io/ labels), and the image layer sets nothing over a base image given as a build argument."""

import os
import re
import subprocess
import sys

import pytest
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
    """What is wrong with a P/D manifest: each Deployment must set ENABLE_XLKV=true and advertise its pod IP as
    the NIXL side-channel host; mount a RAM-backed /dev/shm (emptyDir, medium Memory) and a model cache that
    HF_HOME points into; have a startupProbe; carry the app.kubernetes.io/ labels, its selector among its pods'
    labels. Each Service selects the pods of one Deployment; each claim mounted is in the manifest."""
    problems = []
    docs = [d for d in yaml.safe_load_all(text) if d]
    deployments = [d for d in docs if d.get("kind") == "Deployment"]
    claims = {d["metadata"]["name"] for d in docs if d.get("kind") == "PersistentVolumeClaim"}
    if len(deployments) != 2:
        problems.append("%d Deployments, 2 expected" % len(deployments))
    pod_labels = []
    for d in deployments:
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        pod_labels.append(labels)
        for key in ("name", "instance", "component"):
            for where, have in (("metadata", d["metadata"].get("labels", {})), ("pod template", labels)):
                if "app.kubernetes.io/" + key not in have:
                    problems.append("%s: no app.kubernetes.io/%s label in its %s" % (name, key, where))
        selector = d["spec"]["selector"].get("matchLabels", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            problems.append("%s: its selector is not among its pods' labels" % name)
        for c in pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            if flag.knob_state(flag.FLAG, {k: e.get("value") for k, e in env.items()}) != "on":
                problems.append("%s: ENABLE_XLKV not on" % name)
            host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", {}).get("valueFrom", {})
            if host.get("fieldRef", {}).get("fieldPath") != "status.podIP":
                problems.append("%s: VLLM_NIXL_SIDE_CHANNEL_HOST is not the pod IP" % name)
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            shm = volumes.get(mounts.get("/dev/shm"), {}).get("emptyDir") or {}
            if shm.get("medium") != "Memory":
                problems.append("%s: /dev/shm is not an emptyDir of medium Memory" % name)
            hf_home = env.get("HF_HOME", {}).get("value", "")
            cache = [path for path, vol in mounts.items() if hf_home.startswith(path.rstrip("/") + "/")
                     and "persistentVolumeClaim" in volumes.get(vol, {})]
            if not cache:
                problems.append("%s: HF_HOME (%r) is on no mounted model cache claim" % (name, hf_home))
            if not (c.get("startupProbe") or {}).get("httpGet"):
                problems.append("%s: no startupProbe" % name)
        for v in volumes.values():
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and claim not in claims:
                problems.append("%s: claim %s is not in the manifest" % (name, claim))
    for s in (d for d in docs if d.get("kind") == "Service"):
        selector = s["spec"].get("selector") or {}
        hits = [labels for labels in pod_labels if selector and all(labels.get(k) == v for k, v in selector.items())]
        if len(hits) != 1:
            problems.append("Service %s: selects the pods of %d Deployments, 1 expected" % (s["metadata"]["name"], len(hits)))
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


@pytest.mark.parametrize("old,new,problem", [
    ("emptyDir: {medium: Memory, sizeLimit: 16Gi}", "emptyDir: {sizeLimit: 16Gi}",
     "vllm-decode: /dev/shm is not an emptyDir of medium Memory"),
    ("{name: HF_HOME, value: /models/hf}", "{name: HF_HOME, value: /root/.cache/huggingface}",
     "vllm-decode: HF_HOME ('/root/.cache/huggingface') is on no mounted model cache claim"),
    ("          startupProbe:\n", "          livenessProbe:\n", "vllm-decode: no startupProbe"),
    ("    app.kubernetes.io/component: decode\n", "    role: decode\n",
     "vllm-decode: no app.kubernetes.io/component label in its metadata"),
    ("matchLabels: {app.kubernetes.io/instance: vllm-pd, app.kubernetes.io/component: decode}",
     "matchLabels: {app.kubernetes.io/instance: vllm-pd, app.kubernetes.io/component: decoder}",
     "vllm-decode: its selector is not among its pods' labels"),
    ("claimName: vllm-model-cache}", "claimName: vllm-models}", "vllm-decode: claim vllm-models is not in the manifest"),
])
def test_the_manifest_check_sees_what_a_pod_lacks(old, new, problem):
    """Planted in the decode Deployment of a copy: each of its pod's needs taken away once."""
    second = MANIFEST.index("name: vllm-decode")
    planted = MANIFEST[:second] + MANIFEST[second:].replace(old, new, 1)
    assert planted != MANIFEST, old
    assert problem in manifest_problems(planted), manifest_problems(planted)


def test_the_manifest_check_sees_a_service_that_selects_both():
    planted = MANIFEST.replace("selector: {app.kubernetes.io/instance: vllm-pd, app.kubernetes.io/component: prefill}",
                               "selector: {app.kubernetes.io/instance: vllm-pd}", 1)
    assert planted != MANIFEST
    assert manifest_problems(planted) == ["Service vllm-prefill: selects the pods of 2 Deployments, 1 expected"]


def base_image(dockerfile):
    """The image the Dockerfile's FROM names with its default build arguments."""
    args = {}
    for name, default in re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.M):
        args[name] = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], default)
    (image,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)


def test_the_base_image_is_a_build_argument():
    """FROM names ${BASE_IMAGE} (a mirror or a pinned digest without editing the file), whose default is vLLM's
    official image at ${VLLM_TAG} (docs/deploy.md's --build-arg VLLM_TAG still picks the release)."""
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", DOCKERFILE, re.M), DOCKERFILE
    assert re.search(r"^ARG BASE_IMAGE=vllm/vllm-openai:\$\{VLLM_TAG\}$", DOCKERFILE, re.M), DOCKERFILE
    assert base_image(DOCKERFILE) == "vllm/vllm-openai:v0.33.0"


def test_the_image_layer_installs_the_wheel_and_sets_nothing():
    name = re.search(r"^name = (\S+)", _read("setup.cfg"), re.M).group(1)
    assert re.search(r"^COPY %s-\*\.whl " % name, DOCKERFILE, re.M), DOCKERFILE
    assert base_image(DOCKERFILE).startswith("vllm/vllm-openai:")
    assert not re.search(r"^\s*ENV\s", DOCKERFILE, re.M), "the layer must set no environment"
    assert "ENABLE_XLKV=true python3 -m xlkv_autopatch status" in DOCKERFILE  # the build-time check


def test_deploy_names_no_wheel_version_or_size_it_does_not_derive():
    """docs/deploy.md named a wheel of 0.3.12 (76 KB) long after; a version or a size typed
    into the text goes stale, so the text names none."""
    text = open(os.path.join(ROOT, "docs", "deploy.md")).read()
    assert not re.search(r"xlkv_autopatch-\d+\.\d+\.\d+-py3", text), "a typed wheel version in docs/deploy.md"
    assert not re.search(r"\.whl`? \(\d+ KB\)", text), "a typed wheel size in docs/deploy.md"
