#!/usr/bin/env python3
"""vLLM's own NIXL unit tests, run stock, with the shim installed and off, and with the flag on.

Our tests prove what we thought of; vLLM's own tests prove what vLLM's authors thought of,
and a shim that patches their code must pass them.  For one release:

  upstream_tests.py fetch RELEASE                      the release's sdist through pip's configured
                                                       index, sha256 checked against RELEASES, its
                                                       tests/ (and pyproject.toml: pytest markers)
                                                       unpacked into the cache; prints the folder
  upstream_tests.py run RELEASE --python PY --mode stock|off|on|switches --out R.json [--where W]
                    [--files F ...] [--ids-from FILE] [--shim-path DIR] [--timeout S]
                    [--pytest-args '-k NAME']
                                                       one pytest run of the release's
                                                       tests/v1/kv_connector/unit/test_nixl_*.py
                                                       (or the named files / ids) in PY; the
                                                       outcome of every test id is merged into
                                                       R.json (a run cut by a time limit is resumed
                                                       with the remaining files; "calls" says which
                                                       call ran what)
  upstream_tests.py compare R.json                     stock vs off, on and switches, per test id;
                                                       writes "differ" into R.json; exit 1 when a
                                                       difference is not in INTENDED
  upstream_tests.py merge R.json PART.json ...         modes run side by side (or resumed) -> one file
  upstream_tests.py table                              docs/support-matrix.md's table of experiments/results/upstream-tests-*
  upstream_tests.py pin-cpu RELEASE --python PY        the ids that pass stock on this CPU machine
                                                       -> cpu-passing.json (what CI runs)

Modes: ``stock`` hides the shim from the interpreter (xlkv_upstream_probe.py); ``off`` has it
installed with ENABLE_XLKV unset; ``on`` sets ENABLE_XLKV=true; ``switches`` sets it and every switch
knob too (xlkv_autopatch/flag.py's SWITCHES: patch sets registered only while their knob is on; the
other modes drop any value the caller set for them).  The probe records what the
shim did inside the pytest process; an ``on`` run in which no NIXL patch set was applied, or a
``stock`` run that imported the shim, is refused (it would be a stock run under another name).

The tests name Hugging Face models (facebook/opt-125m in every ``create_vllm_config``,
facebook/opt-350m for hash validation); no hub is reachable here, so an offline cache with
their public config values is written (HF_HOME, HF_HUB_OFFLINE=1).  Tests that generate with
real weights (``LLM(...)``) fail alike in every mode without them.

Cache: ``$XLKV_UPSTREAM_CACHE`` (default ``$XLKV_ENVS/upstream-tests``, ``XLKV_ENVS`` default
/work/envs).
"""

import argparse
import datetime
import fcntl
import fnmatch
import glob
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CPU_PINS = os.path.join(HERE, "cpu-passing.json")
UNIT = "tests/v1/kv_connector/unit"
MODES = ("stock", "off", "on", "switches")


def switches():
    """The shim's switch knobs (xlkv_autopatch/flag.py's SWITCHES, read from this checkout: the module is
    standard library only)."""
    spec = importlib.util.spec_from_file_location("_xlkv_flag", os.path.join(ROOT, "xlkv_autopatch", "flag.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SWITCHES

#: sdist sha256 per release, as the package index serves it (checked on every fetch)
RELEASES = {
    "0.14.1": "c7c6d0a729d29e70ac10baacbc7186930da24f8ae34f60451330527ff0be84ac",
    "0.15.1": None,
    "0.21.0": "05ff89c3e926b88b77d7878e317a659ffba678afc21c1d48952037aa5457f058",
    "0.26.0": "23e9fa19d7e20ce7dcc1c074d41503e2116d23f19e688f5d5ea91b741f958502",
    "0.29.0": "c03feb07943ecae9e69e7dc424d7c5569ecf8d1292513aef2a4de67af381cd97",
    "0.33.0": "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
}

#: differences between stock and a shim mode that are intended: (release glob, test id glob) -> reason.
#: Empty: every difference is a bug until it is explained here, with the refusal it names.
INTENDED = {}

#: public config values of the models the tests name (no weights: nothing here generates on CPU)
HF_CONFIGS = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
        "hidden_size": 768, "ffn_dim": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
        "max_position_embeddings": 2048, "vocab_size": 50272, "word_embed_proj_dim": 768,
        "do_layer_norm_before": True, "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
        "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "init_std": 0.02,
        "layerdrop": 0.0, "torch_dtype": "float16", "use_cache": True, "prefix": "</s>",
    },
    "facebook/opt-350m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
        "hidden_size": 1024, "ffn_dim": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
        "max_position_embeddings": 2048, "vocab_size": 50272, "word_embed_proj_dim": 512,
        "do_layer_norm_before": False, "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1,
        "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "init_std": 0.02,
        "layerdrop": 0.0, "torch_dtype": "float16", "use_cache": True, "prefix": "</s>",
    },
}


def cache_root(environ=None):
    """The cache of fetched test trees, by ``environ`` (default this process's environment)."""
    environ = os.environ if environ is None else environ
    return environ.get("XLKV_UPSTREAM_CACHE") or os.path.join(environ.get("XLKV_ENVS", "/work/envs"),
                                                              "upstream-tests")


# --------------------------------------------------------------------------- fetch


def _download_sdist(release, dest):
    """The sdist through pip's own index configuration (no host names here)."""
    from pip._internal.commands import create_command
    from pip._vendor.packaging.specifiers import SpecifierSet

    cmd = create_command("download")
    opts, _ = cmd.parse_args(["--no-binary", ":all:", "--no-deps", "vllm"])
    session = cmd._build_session(opts)
    finder = cmd._build_package_finder(options=opts, session=session, target_python=None,
                                       ignore_requires_python=True)
    best = finder.find_best_candidate("vllm", SpecifierSet("==" + release)).best_candidate
    if best is None:
        raise SystemExit("no sdist of vllm==%s on the configured package index" % release)
    path = os.path.join(dest, best.link.filename)
    digest = hashlib.sha256()
    with session.get(best.link.url.split("#")[0], stream=True) as r:
        r.raise_for_status()
        with open(path, "wb") as f:
            for chunk in r.iter_content(1 << 20):
                digest.update(chunk)
                f.write(chunk)
    return path, digest.hexdigest()


def fetch(release, root=None):
    """Folder with the release's tests/ and pyproject.toml (no vllm/ source: it would shadow the
    installed package), in the cache ``root`` (default cache_root())."""
    if release not in RELEASES:
        raise SystemExit("release %s has no pinned sdist sha256 in RELEASES (%s)" % (release, ", ".join(RELEASES)))
    root = root or cache_root()
    target = os.path.join(root, "vllm-%s" % release)
    if os.path.isfile(os.path.join(target, ".xlkv-ok")):
        return target
    os.makedirs(root, exist_ok=True)
    # One fetch per release at a time: two callers (the CI test runs stock and flag-on side by
    # side) once both fetched into an empty cache, and the second replaced the tree the first
    # was already running pytest in (seen 2026-11-24 on a fresh machine: "No such file or
    # directory" for its working directory).  A complete tree is never replaced.
    with open(os.path.join(root, ".fetch-%s.lock" % release), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(os.path.join(target, ".xlkv-ok")):
            return target
        _fetch_into(release, target, root)
    return target


def _fetch_into(release, target, root):
    tmp = tempfile.mkdtemp(dir=root)
    try:
        path, got = _download_sdist(release, tmp)
        want = RELEASES[release]
        if want is None:
            raise SystemExit("vllm %s sdist sha256 is %s; pin it in RELEASES first" % (release, got))
        if got != want:
            raise SystemExit("vllm %s sdist sha256 %s differs from the pinned %s: refusing it" % (release, got, want))
        out = os.path.join(tmp, "tree")
        prefix = "vllm-%s/" % release
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and (
                m.name.startswith(prefix + "tests/") or m.name == prefix + "pyproject.toml")]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(out, members=members)
        _write_hf_cache(os.path.join(out, ".hf"))
        open(os.path.join(out, ".xlkv-ok"), "w").write("%s %s\n" % (release, got))
        shutil.rmtree(target, ignore_errors=True)   # an incomplete tree (no .xlkv-ok)
        os.replace(out, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_hf_cache(hf_home):
    for repo, config in HF_CONFIGS.items():
        base = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
        commit = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()
        snap = os.path.join(base, "snapshots", commit)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(base, "refs"), exist_ok=True)
        with open(os.path.join(snap, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        with open(os.path.join(base, "refs", "main"), "w") as f:
            f.write(commit)


# --------------------------------------------------------------------------- run


def test_files(tree, names=None):
    files = sorted(os.path.relpath(p, tree) for p in glob.glob(os.path.join(tree, UNIT, "test_nixl_*.py")))
    if names:
        wanted = [n if n.startswith("tests/") else "%s/%s" % (UNIT, n) for n in names]
        missing = [w for w in wanted if w not in files]
        if missing:
            raise SystemExit("not in this release's test_nixl_*.py: %s" % ", ".join(missing))
        files = wanted
    return files


def _env(tree, mode, out, shim_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "XLKV_VLLM_VERSION")}
    paths = [HERE] + ([shim_path] if shim_path and mode != "stock" else []) + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update({
        "PYTHONPATH": os.pathsep.join(paths),
        "XLKV_UPSTREAM_MODE": mode,
        "XLKV_UPSTREAM_OUT": out,
        "HF_HOME": os.path.join(tree, ".hf"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    if mode in ("on", "switches"):
        env["ENABLE_XLKV"] = "true"
    for name in switches():   # only the switches mode turns them on; any value from the caller is dropped
        env.pop(name, None)
        if mode == "switches":
            env[name] = "true"
    return env


def _check_shim(mode, shim):
    """A run that did not do what its mode says is refused, not counted."""
    nixl_groups = [g for g in shim.get("applied_groups", []) if g.split("-")[0] in ("backport", "native", "layout")]
    if mode == "stock" and shim.get("imported"):
        return "the shim was imported in the stock run"
    if mode == "off" and shim.get("installed"):
        return "the shim installed its patches with ENABLE_XLKV unset"
    if mode in ("on", "switches") and not nixl_groups:
        return "ENABLE_XLKV=true but no NIXL patch set was applied in the pytest process (%s)" % shim
    return None


def run(release, python, mode, out, where, files=None, ids=None, shim_path=None, timeout=None, extra=()):
    tree = fetch(release)
    targets = list(ids) if ids else test_files(tree, files)
    fd, probe_out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [python, "-m", "pytest", "-p", "xlkv_upstream_probe", "-p", "no:cacheprovider", "-q", "-rN",
           "--rootdir", tree] + list(extra) + targets
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=tree, env=_env(tree, mode, probe_out, shim_path), timeout=timeout,
                           capture_output=True, text=True)
        rc, tail = r.returncode, (r.stdout + r.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", ((e.stdout or b"")[-3000:]).decode(errors="replace") if isinstance(
            e.stdout, bytes) else str(e.stdout or "")[-3000:]
    wall = round(time.time() - t0, 1)
    try:
        probe = json.load(open(probe_out))
    except ValueError:
        probe = None
    os.unlink(probe_out)
    if probe is None:
        raise SystemExit("pytest wrote no outcomes (rc %s):\n%s" % (rc, tail))
    bad = _check_shim(mode, probe["shim"])
    if bad:
        raise SystemExit("refusing the %s run of vLLM %s: %s" % (mode, release, bad))
    result = json.load(open(out)) if os.path.isfile(out) else {"release": release, "where": where, "modes": {},
                                                               "calls": []}
    if result.get("release") != release:
        raise SystemExit("%s holds vLLM %s, not %s" % (out, result.get("release"), release))
    m = result["modes"].setdefault(mode, {"outcomes": {}})
    m["outcomes"].update(probe["outcomes"])
    _count(m)
    result["calls"].append({
        "mode": mode, "where": where, "targets": targets if not ids else "%d ids" % len(ids),
        "rc": rc, "wall_s": wall, "shim": probe["shim"],
        "at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": python, "commit": _commit(), "shim_commit": _shim_commit(shim_path)})
    _write(out, result)
    print("vLLM %s %s (%s): %d passed, %d failed, %d errors, %d skipped in %.0f s" % (
        release, mode, where, m["passed"], m["failed"], m["errors"], m["skipped"], wall))
    return result


def _count(m):
    values = list(m["outcomes"].values())
    m.update(passed=values.count("passed"), failed=values.count("failed"), skipped=values.count("skipped"),
             errors=values.count("error"))


def _commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _shim_commit(shim_path):
    """The commit of a shim copy made by gpu.sh pack-shim (None: the checkout itself)."""
    try:
        return open(os.path.join(shim_path, ".xlkv-commit")).read().strip() if shim_path else None
    except OSError:
        return None


def _write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- compare


def intended_reason(release, test_id):
    for (rel_glob, id_glob), reason in INTENDED.items():
        if fnmatch.fnmatch(release, rel_glob) and fnmatch.fnmatch(test_id, id_glob):
            return reason
    return None


def differences(result):
    """[{test, stock, <mode>, mode, reason}] for every id whose outcome differs from stock's."""
    modes = result.get("modes", {})
    stock = modes.get("stock", {}).get("outcomes", {})
    out = []
    for mode in ("off", "on", "switches"):
        other = modes.get(mode, {}).get("outcomes")
        if other is None:
            continue
        for test in sorted(set(stock) & set(other)):
            if stock[test] != other[test]:
                out.append({"test": test, "mode": mode, "stock": stock[test], mode: other[test],
                            "reason": intended_reason(result["release"], test)})
    return out


def compare(path):
    result = json.load(open(path))
    differ = differences(result)
    result["differ"] = differ
    modes = result.get("modes", {})
    stock_ids = set(modes.get("stock", {}).get("outcomes", {}))
    result["not_in_every_mode"] = sorted(
        t for mode in modes.values() for t in mode["outcomes"] if t not in stock_ids or any(
            t not in m["outcomes"] for m in modes.values()))[:50]
    _write(path, result)
    for mode, m in sorted(modes.items()):
        print("%-5s %d passed, %d failed, %d errors, %d skipped (%d ids)" % (
            mode, m["passed"], m["failed"], m["errors"], m["skipped"], len(m["outcomes"])))
    unexplained = [d for d in differ if not d["reason"]]
    for d in differ:
        print("DIFFERS (%s): %s  stock=%s %s=%s  %s" % (d["mode"], d["test"], d["stock"], d["mode"], d[d["mode"]],
                                                        d["reason"] or "UNEXPLAINED"))
    print("%d differences, %d unexplained" % (len(differ), len(unexplained)))
    return 1 if unexplained else 0


def merge(out, parts):
    """Several result files of one release (modes run side by side, or resumed calls) -> one."""
    result = json.load(open(out)) if os.path.isfile(out) else None
    for part in parts:
        data = json.load(open(part))
        if result is None:
            result = {"release": data["release"], "where": data["where"], "modes": {}, "calls": []}
        if data["release"] != result["release"]:
            raise SystemExit("%s holds vLLM %s, not %s" % (part, data["release"], result["release"]))
        for mode, m in data["modes"].items():
            mine = result["modes"].setdefault(mode, {"outcomes": {}})
            mine["outcomes"].update(m["outcomes"])
            _count(mine)
        result["calls"].extend(data["calls"])
    _write(out, result)


# --------------------------------------------------------------------------- docs/support-matrix.md table

RESULTS = os.path.join(ROOT, "experiments", "results")
TABLE_START, TABLE_END = "<!-- upstream:start -->", "<!-- upstream:end -->"


def table(results_dir=RESULTS):
    """docs/support-matrix.md's table of every upstream-tests-*.json result: per release and place, the
    tests run, passed stock, with the flag on and with the flag and every switch on, and the differences
    (explained or not; stock against each other mode)."""
    rows = []
    sys.path.insert(0, os.path.dirname(HERE))
    from pdtools import archive  # a results file kept as X.json.xz is read as X.json
    for path in archive.glob(os.path.join(results_dir, "upstream-tests-*.json")):
        r = archive.load_json(path)
        modes = r["modes"]
        if "stock" not in modes or "on" not in modes:
            continue
        differ = differences(r)
        key = tuple(int(x) for x in r["release"].split(".")), r["where"] != "cpu", r["where"]
        rows.append((key, "| %s | %s | %d | %d | %d | %s | %s | [%s](../experiments/results/%s) |" % (
            r["release"], "CPU (pinned ids)" if r["where"] == "cpu" else r["where"], len(modes["stock"]["outcomes"]),
            modes["stock"]["passed"], modes["on"]["passed"],
            modes["switches"]["passed"] if "switches" in modes else "not run",
            "%d (%d unexplained)" % (len(differ), len([d for d in differ if not d["reason"]])) if differ else "0",
            os.path.basename(path)[:-5], os.path.basename(archive.resolve(path)))))
    head = ["| vLLM | where | tests | passed stock | passed, flag on | passed, flag and switches on | differ | file |",
            "|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + [row for _, row in sorted(rows)])


# --------------------------------------------------------------------------- CPU pins


def cpu_files(tree):
    """Files that collect on a CPU machine without ray (test_nixl_connector.py imports it)."""
    return [f for f in test_files(tree) if not f.endswith("/test_nixl_connector.py")
            and not f.endswith("rocm_gpu_mem_diag.py")]


def pin_cpu(release, python, timeout=None):
    tree = fetch(release)
    files = cpu_files(tree)
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    os.unlink(tmp)
    # vLLM marks the tests that need no GPU (cpu_test); the rest fail on this machine, slowly
    res = run(release, python, "stock", tmp, "cpu", files=files, timeout=timeout, extra=["-m", "cpu_test"])
    os.unlink(tmp)
    passing = sorted(t for t, o in res["modes"]["stock"]["outcomes"].items() if o == "passed")
    pins = json.load(open(CPU_PINS)) if os.path.isfile(CPU_PINS) else {}
    kept = pins.get(release, {}).get("added_by_hand", [])  # ids without cpu_test that pass on CPU (see "added_why")
    pins[release] = dict(pins.get(release, {}), files=files, passing_stock=sorted(set(passing) | set(kept)),
                         of=len(res["modes"]["stock"]["outcomes"]), commit=_commit())
    _write(CPU_PINS, pins)
    print("vLLM %s: %d of %d ids pass stock on this CPU machine -> %s" % (
        release, len(passing), len(res["modes"]["stock"]["outcomes"]), CPU_PINS))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("release")
    r = sub.add_parser("run")
    r.add_argument("release")
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--mode", choices=MODES, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--where", default="cpu")
    r.add_argument("--files", nargs="*")
    r.add_argument("--ids-from", help="a cpu-passing.json: run that release's pinned ids")
    r.add_argument("--shim-path", help="put this checkout on PYTHONPATH (its sitecustomize.py activates the shim)")
    r.add_argument("--timeout", type=float)
    r.add_argument("--pytest-args", default="", help="more pytest arguments, one string (e.g. \"-k hisparse\")")
    c = sub.add_parser("compare")
    c.add_argument("result")
    sub.add_parser("table", help="docs/support-matrix.md's table of the result files")
    mg = sub.add_parser("merge")
    mg.add_argument("out")
    mg.add_argument("parts", nargs="+")
    pc = sub.add_parser("pin-cpu")
    pc.add_argument("release")
    pc.add_argument("--python", default=sys.executable)
    pc.add_argument("--timeout", type=float)
    a = p.parse_args(argv)
    if a.cmd == "fetch":
        print(fetch(a.release))
    elif a.cmd == "run":
        ids = json.load(open(a.ids_from))[a.release]["passing_stock"] if a.ids_from else None
        run(a.release, a.python, a.mode, a.out, a.where, files=a.files, ids=ids, shim_path=a.shim_path,
            timeout=a.timeout, extra=shlex.split(a.pytest_args))
    elif a.cmd == "compare":
        return compare(a.result)
    elif a.cmd == "table":
        print(table())
    elif a.cmd == "merge":
        merge(a.out, a.parts)
    elif a.cmd == "pin-cpu":
        pin_cpu(a.release, a.python, timeout=a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
