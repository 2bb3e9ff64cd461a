"""experiments/bundle.sh without network or GPU: a tiny fake bundle goes through pack
(compress + split + MANIFEST), stage (one chunk per "call"), setup (verify, unpack, import
probes) and check.  The fake site holds a fake torch, vllm (with vllm._C) and nixl; a fake
"image" site-packages on PYTHONPATH holds another torch, which must lose to $SITE's."""
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "experiments" / "bundle.sh"
CHUNK = 4096

pytestmark = pytest.mark.skipif(
    not (shutil.which("xz") and shutil.which("tar") and shutil.which("split")),
    reason="needs tar, xz and split")

FAKE_TORCH = '''
__version__ = "{version}"
class _Nccl:
    @staticmethod
    def version(): return (2, 30, 7)
class cuda:
    nccl = _Nccl
    @staticmethod
    def is_available(): return False
    @staticmethod
    def device_count(): return 0
class version:
    cuda = "13.0"
class backends:
    class cudnn:
        @staticmethod
        def version(): return 92400
'''


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _dist_info(site: Path, name: str, version: str) -> None:
    _write(site / f"{name}-{version}.dist-info" / "METADATA",
           f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def make_site(root: Path, vllm_c: str = "") -> Path:
    site = root / "fakesite"
    _write(site / "torch" / "__init__.py", FAKE_TORCH.format(version="9.9.0+cu130"))
    _dist_info(site, "torch", "9.9.0+cu130")
    _write(site / "vllm" / "__init__.py", "")
    _write(site / "vllm" / "_C.py", vllm_c)
    _dist_info(site, "vllm", "0.99.0")
    _write(site / "nixl" / "__init__.py", "")
    _write(site / "nixl" / "_api.py", "")
    # incompressible payload, so that the bundle needs several chunks
    lib = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(os.urandom(5 * CHUNK + 123))
    return site


def make_image(root: Path) -> Path:
    image = root / "image-site-packages"
    _write(image / "torch" / "__init__.py", FAKE_TORCH.format(version="1.0.0+image"))
    return image


def run(args, root: Path, cwd: Path, env_extra=None, check=True):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SITE", "STAGE_ROOT")}
    env.update(SITE=str(root / "site"), STAGE_ROOT=str(root / "stage"), PYTHON=sys.executable,
               CHUNK_BYTES=str(CHUNK), BUNDLE_COMPRESS="xz")
    env.update(env_extra or {})
    p = subprocess.run(["bash", str(BUNDLE), *args], cwd=cwd, env=env, text=True,
                       capture_output=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stdout + p.stderr
    return p


def build(root: Path, vllm_c: str = "") -> Path:
    """pack into <root>/checkout/.xferT (the folder a call carries), with a torch header"""
    site = make_site(root, vllm_c)
    checkout = root / "checkout"
    hdr = root / "carried.txt"
    hdr.write_text("torch 9.9.0\ncarry torch==9.9.0\ncarry nvidia-nccl-cu13==2.30.7\n")
    run(["pack", str(site), str(checkout / ".xferT"), "0.99.0", str(hdr)], root, cwd=root)
    return checkout


def chunks(bundle: Path):
    return sorted(p for p in bundle.iterdir() if p.name.startswith("p"))


def stage_one_per_call(root: Path, checkout: Path, name: str = ".xferT") -> None:
    """each device call's working tree holds one chunk (and MANIFEST with the first)"""
    for i, chunk in enumerate(chunks(checkout / name)):
        call = root / f"call{name}{i}"
        (call / name).mkdir(parents=True)
        shutil.copy(chunk, call / name)
        if i == 0:
            shutil.copy(checkout / name / "MANIFEST", call / name)
        out = run(["stage", name], root, cwd=call).stdout
        assert f"staged {name}/{chunk.name}" in out


def test_pack_splits_into_chunks_within_the_limit_and_lists_them(tmp_path):
    checkout = build(tmp_path)
    parts = chunks(checkout / ".xferT")
    assert len(parts) >= 5
    assert all(p.stat().st_size <= CHUNK for p in parts)
    assert [p.name for p in parts] == [f"p{i:02d}" for i in range(len(parts))]
    manifest = (checkout / ".xferT" / "MANIFEST").read_text().splitlines()
    assert manifest[0] == "version 0.99.0"
    assert "torch 9.9.0" in manifest and "carry nvidia-nccl-cu13==2.30.7" in manifest
    listed = {line.split()[1]: line.split()[2] for line in manifest if line.startswith("chunk ")}
    assert listed == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in parts}
    # manifest rewrites keep the torch/carry lines
    run(["manifest", ".xferT", "0.99.0"], tmp_path, cwd=checkout)
    assert (checkout / ".xferT" / "MANIFEST").read_text().splitlines() == manifest


def test_stage_setup_check_puts_site_torch_ahead_of_the_image(tmp_path):
    checkout = build(tmp_path)
    stage_one_per_call(tmp_path, checkout)
    image = make_image(tmp_path)
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path / "call.xferT0", env_extra={"PYTHONPATH": str(image)})
    out = p.stdout
    site = tmp_path / "site"
    assert (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").stat().st_size == 5 * CHUNK + 123
    assert "the bundle carries torch 9.9.0: torch==9.9.0 nvidia-nccl-cu13==2.30.7" in out
    assert f"import torch: 9.9.0+cu130 cuda_available=False from {site}/torch/__init__.py" in out
    assert "import vLLM's extension: vllm._C ok" in out
    assert "vllm 0.99.0, torch 9.9.0+cu130" in out and "nccl 2.30.7" in out
    # a second setup finds the release unpacked; check prints the same versions
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path, env_extra={"PYTHONPATH": str(image)})
    assert "already holds vLLM 0.99.0" in p.stdout
    p = run(["check"], tmp_path, cwd=tmp_path, env_extra={"PYTHONPATH": str(image)})
    assert "import torch: 9.9.0+cu130" in p.stdout and "import nixl._api: ok" in p.stdout


def test_setup_fails_when_the_image_torch_wins(tmp_path):
    """a bundle whose MANIFEST names a torch the site lacks: the probe says so and fails"""
    checkout = build(tmp_path)
    shutil.rmtree(tmp_path / "fakesite" / "torch")
    hdr = tmp_path / "carried.txt"
    run(["pack", str(tmp_path / "fakesite"), str(checkout / ".xferT"), "0.99.0", str(hdr)],
        tmp_path, cwd=tmp_path)
    stage_one_per_call(tmp_path, checkout)
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path,
            env_extra={"PYTHONPATH": str(make_image(tmp_path))}, check=False)
    assert p.returncode != 0
    assert "import torch: FAILED ImportError: torch 1.0.0+image" in p.stdout


def test_setup_names_the_missing_library_of_vllm_C(tmp_path):
    msg = "libnccl.so.2: cannot open shared object file: No such file or directory"
    checkout = build(tmp_path, vllm_c=f"raise ImportError({msg!r})\n")
    stage_one_per_call(tmp_path, checkout)
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path, check=False)
    assert p.returncode != 0
    assert f"import vLLM's extension: FAILED ImportError: {msg}" in p.stdout
    assert "import torch: 9.9.0+cu130" in p.stdout


def test_setup_refuses_a_corrupted_or_missing_chunk(tmp_path):
    checkout = build(tmp_path)
    stage_one_per_call(tmp_path, checkout)
    staged = tmp_path / "stage" / ".xferT"
    data = bytearray((staged / "p01").read_bytes())
    data[100] ^= 0xFF
    (staged / "p01").write_bytes(bytes(data))
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path, check=False)
    assert p.returncode == 2 and "CORRUPT: p01" in p.stderr
    assert not (tmp_path / "site").exists()
    (staged / "p02").unlink()
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path, check=False)
    assert p.returncode == 2 and "MISSING: p02 (stage it: carry .xferT/p02)" in p.stderr


def test_stage_rejects_a_chunk_that_differs_from_the_manifest(tmp_path):
    checkout = build(tmp_path)
    bad = chunks(checkout / ".xferT")[0]
    bad.write_bytes(b"x" + bad.read_bytes()[1:])
    p = run(["stage", ".xferT"], tmp_path, cwd=checkout, check=False)
    assert p.returncode == 2 and "CHECKSUM MISMATCH" in p.stderr
    assert not (tmp_path / "stage" / ".xferT" / bad.name).exists()


def test_add_unpacks_a_libs_bundle_into_the_site_and_links_the_image_libraries(tmp_path):
    """0.12-0.19: the CUDA-12 libraries travel as a second bundle (build-libs); `add` unpacks it
    into the same $SITE, once, and links the image's library folders that the bundles do not
    carry (same soname in CUDA 12 and 13), never its nvidia/cu13 and never over a carried one"""
    checkout = build(tmp_path)
    stage_one_per_call(tmp_path, checkout)
    libs = tmp_path / "libsite"
    (libs / "nvidia" / "cublas" / "lib").mkdir(parents=True)
    (libs / "nvidia" / "cublas" / "lib" / "libcublas.so.12").write_bytes(os.urandom(2 * CHUNK))
    hdr = tmp_path / "libs.txt"
    hdr.write_text("libs for torch 9.9.0\ncarry nvidia_cublas_cu12==12.8\n")
    run(["pack", str(libs), str(checkout / ".xferL"), "libs-torch-9.9.0", str(hdr)], tmp_path, cwd=tmp_path)
    assert "libs for torch 9.9.0" in (checkout / ".xferL" / "MANIFEST").read_text()
    stage_one_per_call(tmp_path, checkout, ".xferL")
    image = tmp_path / "image"
    for name in ("cudnn", "nccl", "cu13"):
        (image / "nvidia" / name / "lib").mkdir(parents=True)
    env = {"XLKV_IMAGE_SITE": str(image)}
    p = run(["add", ".xferL"], tmp_path, cwd=tmp_path, env_extra=env, check=False)
    assert p.returncode == 2 and "setup the main bundle first" in p.stderr
    run(["setup", ".xferT"], tmp_path, cwd=tmp_path)
    out = run(["add", ".xferL"], tmp_path, cwd=tmp_path, env_extra=env).stdout
    site = tmp_path / "site"
    assert (site / "nvidia" / "cublas" / "lib" / "libcublas.so.12").stat().st_size == 2 * CHUNK
    assert (site / "nvidia" / "cudnn").resolve() == (image / "nvidia" / "cudnn").resolve()
    assert "linked the image's nvidia/cudnn" in out
    assert not (site / "nvidia" / "nccl").is_symlink()       # carried by the main bundle
    assert not (site / "nvidia" / "cu13").exists()           # other sonames: never linked
    assert "import torch: 9.9.0+cu130" in out                # the main bundle's torch is checked
    again = run(["add", ".xferL"], tmp_path, cwd=tmp_path, env_extra=env).stdout
    assert ".xferL already added" in again


# ---------------------------------------------------------------------------------------------
# build / build-libs with a stubbed pip: which CUDA wheels travel with a carried torch, at which
# versions (bundle.sh torch_pins, the one helper behind XLKV_BUNDLE_LIBS and build-libs' names)

FAKE_PIP = r'''
"""pip download stand-in: a wheel per requirement (NAME==VER, or NAME at 1.0) into -d DEST,
with Requires-Dist lines from $FAKE_REQUIRES/<name>.txt; every requirement logged."""
import os, re, sys, zipfile
args = sys.argv[1:]
assert args[0] == "download", args
dest, reqs, i = None, [], 1
while i < len(args):
    a = args[i]
    if a in ("-d", "-r", "--platform", "--python-version", "--implementation"):
        if a == "-d":
            dest = args[i + 1]
        if a == "-r":
            reqs += [l.strip() for l in open(args[i + 1]) if l.strip()]
        i += 2
        continue
    if not a.startswith("-"):
        reqs.append(a)
    i += 1
for req in reqs:
    with open(os.environ["FAKE_PIP_LOG"], "a") as log:
        log.write(req + "\n")
    name, _, ver = req.partition("==")
    ver = ver or "1.0"
    dist = re.sub(r"[-.]+", "_", name).lower()
    tag = "cp38-abi3-manylinux_2_31_x86_64" if dist == "vllm" else "py3-none-any"
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, ver)
    path = os.path.join(os.environ["FAKE_REQUIRES"], dist + ".txt")
    if os.path.exists(path):
        meta += "".join("Requires-Dist: %s\n" % l.strip() for l in open(path) if l.strip())
    with zipfile.ZipFile(os.path.join(dest, "%s-%s-%s.whl" % (dist, ver, tag)), "w") as z:
        z.writestr("%s-%s.dist-info/METADATA" % (dist, ver), meta)
        z.writestr("%s/__init__.py" % dist, "")
'''

FAKE_UV = '''#!/bin/bash
# uv pip compile stand-in: the resolution is numpy alone
while [ $# -gt 0 ]; do [ "$1" = -o ] && echo "numpy==1.0" > "$2"; shift; done
'''

TORCH_REQUIRES = """triton==3.8.0
nvidia-nccl-cu13==2.30.7; platform_system == "Linux"
nvidia-cublas-cu13==13.1.1.3; platform_system == "Linux"
nvidia-cudnn-cu13==9.24.0.50; platform_system == "Linux"
nvidia-nccl-cu12==2.27.5; platform_system == "Windows"
"""


def stub_pip(root: Path) -> dict:
    """PYTHON and PATH for bundle.sh so that pip downloads and uv resolves nothing from the net."""
    (root / "requires").mkdir()
    (root / "requires" / "torch.txt").write_text(TORCH_REQUIRES)
    (root / "requires" / "vllm.txt").write_text("torch==9.9.0\ntorchvision==0.99.0\n")
    (root / "fake_pip.py").write_text(FAKE_PIP)
    py = root / "python"
    py.write_text('#!/bin/bash\nif [ "$1 $2" = "-m pip" ]; then shift 2; exec "%s" "%s" "$@"; fi\nexec "%s" "$@"\n'
                  % (sys.executable, root / "fake_pip.py", sys.executable))
    py.chmod(0o755)
    bin_ = root / "bin"
    bin_.mkdir()
    (bin_ / "uv").write_text(FAKE_UV)
    (bin_ / "zstd").write_text("#!/bin/sh\nexit 1\n")   # build asks for it; BUNDLE_COMPRESS=xz packs
    for tool in ("uv", "zstd"):
        (bin_ / tool).chmod(0o755)
    return {"PYTHON": str(py), "PATH": "%s:%s" % (bin_, os.environ["PATH"]), "FAKE_REQUIRES": str(root / "requires"),
            "FAKE_PIP_LOG": str(root / "pip.log"), "BUNDLE_WORK": str(root / "work")}


def carried(bundle: Path):
    return sorted(l.split()[1] for l in (bundle / "MANIFEST").read_text().splitlines() if l.startswith("carry "))


@pytest.mark.skipif(not shutil.which("unzip"), reason="needs unzip")
def test_build_libs_takes_torchs_pins_for_bare_names(tmp_path):
    env = stub_pip(tmp_path)
    p = run(["build-libs", "9.9.0", str(tmp_path / ".xferL"), "nvidia-nccl-cu13", "nvidia-cublas-cu13",
             "nvidia-foo-cu13==1.2"], tmp_path, cwd=tmp_path, env_extra=env)
    assert "carrying: nvidia-nccl-cu13==2.30.7 nvidia-cublas-cu13==13.1.1.3 nvidia-foo-cu13==1.2" in p.stdout
    assert carried(tmp_path / ".xferL") == ["nvidia_cublas_cu13==13.1.1.3", "nvidia_foo_cu13==1.2",
                                            "nvidia_nccl_cu13==2.30.7"]
    p = run(["build-libs", "9.9.0", str(tmp_path / ".xferL"), "nvidia-nccl-cu13", "nvidia-cusparselt-cu13"],
            tmp_path, cwd=tmp_path, env_extra=env, check=False)
    assert p.returncode == 2 and "torch 9.9.0 does not pin nvidia-cusparselt-cu13: give" in p.stderr
    assert "nvidia-cusparselt" not in (tmp_path / "pip.log").read_text()


@pytest.mark.skipif(not shutil.which("unzip"), reason="needs unzip")
def test_build_carries_torchs_pins_of_xlkv_bundle_libs_less_the_images(tmp_path):
    env = stub_pip(tmp_path)
    image = tmp_path / "image.txt"   # the image: another torch, torch's cublas pin, an older nccl
    image.write_text("torch==2.11.0\ntorchvision==0.26.0\nnvidia-cublas-cu13==13.1.1.3\nnvidia-nccl-cu13==2.28.9\n")
    env.update(XLKV_BUNDLE_IMAGE=str(image), XLKV_BUNDLE_LIBS="nvidia-nccl-cu13 nvidia-cublas-cu13 nvidia-foo-cu13==1.2")
    p = run(["build", "0.99.0", str(tmp_path / ".xferB")], tmp_path, cwd=tmp_path, env_extra=env)
    assert "nvidia-cublas-cu13==13.1.1.3: the image has it, not carried" in p.stdout + p.stderr
    assert carried(tmp_path / ".xferB") == ["nvidia-foo-cu13==1.2", "nvidia-nccl-cu13==2.30.7", "torch==9.9.0",
                                            "torchvision==0.99.0", "triton==3.8.0"]
    env["XLKV_BUNDLE_LIBS"] = "none"
    run(["build", "0.99.0", str(tmp_path / ".xferB")], tmp_path, cwd=tmp_path, env_extra=env)
    assert carried(tmp_path / ".xferB") == ["torch==9.9.0", "torchvision==0.99.0", "triton==3.8.0"]


def test_rechunk_cuts_the_same_bytes_smaller_and_the_bundle_still_sets_up(tmp_path):
    """The tracked tree grew until tree + a 55 MB chunk passed the 64 MiB a device call carries (2026-11-27):
    rechunk cuts the chunks anew, the same bytes, MANIFEST rewritten with its torch/carry lines."""
    checkout = build(tmp_path)
    bundle = checkout / ".xferT"
    before = b"".join(p.read_bytes() for p in chunks(bundle))
    header = [l for l in (bundle / "MANIFEST").read_text().splitlines() if not l.startswith("chunk ")]
    small = CHUNK // 2 + 1
    out = run(["rechunk", ".xferT"], tmp_path, cwd=checkout, env_extra={"CHUNK_BYTES": str(small)}).stdout
    parts = chunks(bundle)
    assert b"".join(p.read_bytes() for p in parts) == before
    assert len(parts) > 5 and all(p.stat().st_size <= small for p in parts), [p.stat().st_size for p in parts]
    assert "rechunked .xferT: %d chunks" % len(parts) in out
    manifest = (bundle / "MANIFEST").read_text().splitlines()
    assert [l for l in manifest if not l.startswith("chunk ")] == header
    assert {l.split()[1]: l.split()[2] for l in manifest if l.startswith("chunk ")} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in parts}
    assert not [p for p in checkout.iterdir() if ".rechunk." in p.name]
    stage_one_per_call(tmp_path, checkout)
    p = run(["setup", ".xferT"], tmp_path, cwd=tmp_path / "call.xferT0",
            env_extra={"PYTHONPATH": str(make_image(tmp_path))})
    assert "import vLLM's extension: vllm._C ok" in p.stdout
