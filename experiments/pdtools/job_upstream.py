"""vLLM's own NIXL unit tests on a lent GPU machine (no network there): stock vs ENABLE_XLKV=true
(experiments/upstream/gpu.sh; the tool itself is experiments/upstream/upstream_tests.py).

    here:  upstream pack DIR RELEASE...
             DIR/up.tar.zst: the test dependencies the GPU image lacks (tblib; ray without its
             jars: test_nixl_connector.py imports it), as Python 3.12 wheels unpacked, and each
             release's tests/ tree (fetched and sha256-checked by upstream_tests.py fetch)
    here:  upstream pack-shim DIR [COMMIT]
             DIR/shim.tar: the shim as committed (git archive of xlkv_autopatch/ and
             sitecustomize.py at COMMIT, default HEAD; .xlkv-commit names it), so that what runs
             there is a commit, not a working tree other work is changing
    there: upstream unpack DIR        -> /tmp/up/{site,trees/vllm-R,shim}
    there: upstream run RELEASE WHERE [N]
             with the release's vLLM bundle in $SITE (experiments/bundle.sh setup): the stock and
             the flag-on runs side by side, each under pytest-xdist with N workers (default 4),
             then `compare`; $OUT/upstream-tests-RELEASE-WHERE.json (+ the console tails).
             UPSTREAM_FILES="a.py b.py" runs only those files (resume a cut run with the rest);
             UPSTREAM_MODES="stock on switches" (the default; add "off" for the installed-but-off
             mode; "switches" has the flag and every switch knob on, since 2026-11-27).

The shim travels as shim.tar: the flag-on run puts /tmp/up/shim on PYTHONPATH, where its
sitecustomize.py activates it; the stock run hides it (xlkv_upstream_probe.py).

The tool's fetch, merge and compare are called as functions (their return values, not their
output); only the mode runs are processes of their own (side by side, each with its own ports).
"""

import functools
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .settings import EXIT_SETUP, EXP_DIR, REPO_DIR

TOOL = os.path.join(EXP_DIR, "upstream", "upstream_tests.py")
WHEELS = ("tblib==3.1.0", "ray==2.48.0")
#: a child with the staged zstandard wheel on its PYTHONPATH unpacks up.tar.zst (ARCHIVE DEST)
UNPACK_ZST = ("import sys, tarfile, zstandard\n"
              "with open(sys.argv[1], 'rb') as f:\n"
              "    tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(f), mode='r|').extractall(sys.argv[2])\n")


@functools.lru_cache(maxsize=None)
def upstream_tests():
    """experiments/upstream/upstream_tests.py as a module (a script beside the package: loaded from
    its file)."""
    spec = importlib.util.spec_from_file_location("upstream_tests", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pack(settings, dest, releases):
    work = tempfile.mkdtemp()
    try:
        site, trees = os.path.join(work, "up", "site"), os.path.join(work, "up", "trees")
        os.makedirs(site), os.makedirs(trees), os.makedirs(dest, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                        "--platform", "manylinux_2_17_x86_64", "--platform", "any", "-d",
                        os.path.join(work, "wheels")] + list(WHEELS), check=True)
        for w in glob.glob(os.path.join(work, "wheels", "*.whl")):
            subprocess.run([sys.executable, "-m", "zipfile", "-e", w, site], check=True)
        shutil.rmtree(os.path.join(site, "ray", "jars"), ignore_errors=True)
        tool = upstream_tests()
        for rel in releases:
            tree = tool.fetch(rel, root=tool.cache_root(settings.environ))
            shutil.copytree(tree, os.path.join(trees, "vllm-" + rel), symlinks=True)
        if not shutil.which("zstd"):
            subprocess.run("apt-get update -qq && apt-get install -y -qq zstd", shell=True, check=True)
        with open(os.path.join(dest, "up.tar.zst"), "wb") as out:
            tar = subprocess.Popen(["tar", "-C", work, "-cf", "-", "up"], stdout=subprocess.PIPE)
            subprocess.run(["zstd", "-q", "-T0", "-12"], stdin=tar.stdout, stdout=out, check=True)
            tar.wait()
        print("%s: %d bytes" % (os.path.join(dest, "up.tar.zst"), os.path.getsize(os.path.join(dest, "up.tar.zst"))))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def pack_shim(dest, commit="HEAD"):
    commit = subprocess.run(["git", "-C", REPO_DIR, "rev-parse", "--short", commit], capture_output=True, text=True,
                            check=True).stdout.strip()
    os.makedirs(dest, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        archive = subprocess.Popen(["git", "-C", REPO_DIR, "archive", commit, "xlkv_autopatch", "sitecustomize.py"],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-C", tmp, "-xf", "-"], stdin=archive.stdout, check=True)
        archive.wait()
        with open(os.path.join(tmp, ".xlkv-commit"), "w") as f:
            f.write(commit + "\n")
        subprocess.run(["tar", "-C", tmp, "-cf", os.path.join(dest, "shim.tar"), "."], check=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("shim at %s -> %s" % (commit, os.path.join(dest, "shim.tar")))
    return 0


def unpack(settings, src):
    up = settings.get("UP", "/tmp/up")
    shim_tar = os.path.join(REPO_DIR, src, "shim.tar")
    if os.path.isfile(shim_tar):
        shutil.rmtree(os.path.join(up, "shim"), ignore_errors=True)
        os.makedirs(os.path.join(up, "shim"))
        subprocess.run(["tar", "-C", os.path.join(up, "shim"), "-xf", shim_tar], check=True)
        print("shim at %s" % open(os.path.join(up, "shim", ".xlkv-commit")).read().strip())
    if not os.path.isdir(os.path.join(up, "site", "tblib")):
        found = sorted(glob.glob("/tmp/stage/.*/zstandard-*.whl") + glob.glob("/tmp/stage/*/zstandard-*.whl") +
                       glob.glob(os.path.join(REPO_DIR, ".xfer*", "zstandard-*.whl")))
        if not found:
            print("no zstandard wheel staged (bundle.sh stage carries one)", file=sys.stderr)
            return EXIT_SETUP
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", "/tmp/zs",
                        found[0]], env=settings.environ, check=True)
        old = settings.environ.get("PYTHONPATH")
        subprocess.run([sys.executable, "-c", UNPACK_ZST, os.path.join(REPO_DIR, src, "up.tar.zst"), "/tmp"],
                       env=dict(settings.environ, PYTHONPATH="/tmp/zs" + (":" + old if old else "")), check=True)
    print("\n".join(sorted(os.listdir(os.path.join(up, "trees")))))
    return 0


def run(settings, rel, where, n="4"):
    """The stock, flag-on and switches-on runs side by side, then merge and compare."""
    s = settings
    up = s.get("UP", "/tmp/up")
    out = s.get("OUT") or os.path.join(up, "out")
    runs = os.path.join(up, "runs")
    os.makedirs(out, exist_ok=True), os.makedirs(runs, exist_ok=True)
    env = dict(s.environ, XLKV_UPSTREAM_CACHE=os.path.join(up, "trees"), VLLM_USE_FLASHINFER_SAMPLER="0")
    env["PYTHONPATH"] = ":".join(p for p in (s.get("SITE"), os.path.join(up, "site"), s.environ.get("PYTHONPATH"))
                                 if p)
    files = ["--files"] + s.get("UPSTREAM_FILES").split() if s.get("UPSTREAM_FILES") else []
    res = os.path.join(out, "upstream-tests-%s-%s.json" % (rel, where))
    procs, base = [], 6000
    for mode in s.get("UPSTREAM_MODES", "stock on switches").split():
        base += 200
        part = os.path.join(runs, "%s-%s-%s-%s.json" % (rel, where, mode, time.strftime("%H%M%S")))
        logf = open(os.path.join(runs, mode + ".log"), "w")
        cmd = [sys.executable, TOOL, "run", rel, "--python", s.get("UPSTREAM_PYTHON", "python3"), "--mode", mode,
               "--out", part, "--where", where, "--shim-path", os.path.join(up, "shim")] + files + [
               "--timeout", s.get("UPSTREAM_TIMEOUT", "540"), "--pytest-args", "-n %s --dist load -p no:randomly" % n]
        procs.append((mode, part, logf, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=dict(
            env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(base), VLLM_PORT=str(base + 100)))))
    rc, parts = 0, []
    for mode, part, logf, proc in procs:
        if proc.wait() == 0:
            parts.append(part)
        else:
            print("mode %s failed:" % mode)
            rc = 1
        logf.close()
        with open(logf.name, errors="replace") as f:
            sys.stdout.write("".join(f.readlines()[-5:]))
        shutil.copy(logf.name, os.path.join(out, "console-%s-%s.txt" % (rel, mode)))
    tool = upstream_tests()
    if parts:
        try:
            tool.merge(res, parts)
        except SystemExit as e:     # the parts disagree (another release): said; compare judges what is there
            print("merge: %s" % e, file=sys.stderr)
    if os.path.isfile(res) and tool.compare(res) != 0:
        rc = 1
    return rc


def main(settings, argv):
    """The job with the door's ``settings`` and its arguments; its exit code."""
    usage = "usage: gpu.sh pack DIR RELEASE... | pack-shim DIR [COMMIT] | unpack DIR | run RELEASE WHERE [N]"
    if not argv:
        print(usage, file=sys.stderr)
        return EXIT_SETUP
    cmd, args = argv[0], argv[1:]
    if cmd == "pack" and len(args) >= 2:
        return pack(settings, args[0], args[1:])
    if cmd == "pack" and len(args) == 1:
        print("name at least one release", file=sys.stderr)
        return EXIT_SETUP
    if cmd == "pack-shim" and args:
        return pack_shim(*args[:2])
    if cmd == "unpack" and args:
        return unpack(settings, args[0])
    if cmd == "run" and len(args) >= 2:
        return run(settings, *args[:3])
    print("unknown command %s\n%s" % (cmd, usage), file=sys.stderr)
    return EXIT_SETUP
