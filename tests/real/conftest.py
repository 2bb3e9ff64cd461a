"""Real-vLLM fixtures: one environment per release in XLKV_TEST_VLLM, shim installed in it.

Environments come from tests/harness/mkenv.sh (a base venv per torch pin, and an overlay venv
per other release of that pin, so releases never swap each other's vLLM); pytest orders the
session-scoped parametrized fixture so that each release is set up once.

XLKV_TEST_PYTHONS="0.28.0=/path/to/python ..." uses ready environments instead (each
must have vLLM, nixl and the shim installed).
"""

import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _releases():
    given = dict(item.split("=", 1) for item in os.environ.get("XLKV_TEST_PYTHONS", "").split() if "=" in item)
    if given:
        return given
    wanted = os.environ.get("XLKV_TEST_VLLM", "").split()
    if wanted == ["none"]:
        return {}
    return {v: None for v in wanted}


RELEASES = _releases()


def _install_env(version):
    r = subprocess.run(["bash", os.path.join(ROOT, "tests", "harness", "mkenv.sh"), version], capture_output=True,
                       text=True, timeout=3000)
    if r.returncode != 0:
        raise RuntimeError("mkenv.sh %s failed:\n%s" % (version, r.stderr[-4000:]))
    python = r.stdout.strip().splitlines()[-1]
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "wrapt>=1.14",
                        "packaging>=21"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e", ROOT],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return python


@pytest.fixture(scope="session", params=sorted(RELEASES) or [None],
                ids=lambda v: "vllm-%s" % v if v else "no-vllm")
def vllm_env(request):
    version = request.param
    if version is None:
        pytest.skip("no vLLM release selected (XLKV_TEST_VLLM=none)")
    python = RELEASES[version] or _install_env(version)
    return version, python


def run_in(python, args, env=None, timeout=600, **kw):
    base = {k: v for k, v in os.environ.items() if k not in ("ENABLE_XLKV", "PYTHONPATH", "XLKV_VLLM_VERSION")}
    base.update(env or {})
    return subprocess.run([python] + list(args), capture_output=True, text=True, env=base, timeout=timeout,
                          cwd=kw.pop("cwd", "/"), **kw)


def _everywhere():
    return os.environ.get("XLKV_TEST_EVERYWHERE", "").strip() in ("1", "true", "yes", "on")


def _key(version):
    return tuple(int(x) for x in version.split(".")[:3])


#: Checks that do not depend on the release's NIXL mechanism (activation, the harness's own
#: fault detection, the lab's tools) run on one release to keep CI inside its time: the newest one
#: selected.  XLKV_TEST_EVERYWHERE=1 runs them on every selected release.
def once_per_session(vllm_env, why):
    if _everywhere():
        return
    newest = max(RELEASES, key=_key)
    if vllm_env[0] != newest:
        pytest.skip("runs on vLLM %s only (%s; XLKV_TEST_EVERYWHERE=1 runs it on every release)" % (newest, why))


#: Checks of a transport around vLLM's connector (two hosts over a veth) whose release-dependent branches
#: split once, between the oldest and the newest CI release: they run on those two (0.14.1 and 0.33.0 in
#: CI), not on the releases between, whose connector code the per-release files (test_pd_transfer,
#: test_hetero_tp, ...) cover.
#: XLKV_TEST_EVERYWHERE=1 runs them on every selected release.
def at_the_ends(vllm_env, why):
    if _everywhere():
        return
    ends = (min(RELEASES, key=_key), max(RELEASES, key=_key))
    if vllm_env[0] not in ends:
        pytest.skip("runs on vLLM %s and %s only (%s; XLKV_TEST_EVERYWHERE=1 runs it on every release)"
                    % (ends + (why,)))


HARNESS = os.path.join(ROOT, "tests", "harness", "pd_harness.py")


class HarnessResult(dict):
    """A harness result whose missing keys fail with the harness's own errors (a side that never
    started has no "d" or "p"), and the machine's load when it ran (a set-up timeout on a loaded
    2-core machine is load, not a finding), instead of a bare KeyError."""

    def __missing__(self, key):
        raise AssertionError("the harness result has no %r (a side did not start?); its errors: %s; load average "
                             "%s on %d cores" % (key, json.dumps(self.get("errors"))[-3000:],
                                                 "/".join("%.1f" % x for x in os.getloadavg()), os.cpu_count() or 0))


def free_ports(n=8):
    """The first of ``n`` consecutive TCP ports free on 127.0.0.1 now: a harness run's side channels (P, D and a
    refused peer: --p-port, +1, +2).  The harness's fixed defaults (5611...) are shared by every run on the
    machine, so two sessions' runs at once would handshake with each other's engines."""
    import random
    import socket
    rnd = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    for _ in range(200):
        base = rnd.randrange(20000, 32000 - n)  # below Linux's ephemeral ports (32768-60999)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no %d consecutive free ports found" % n)


#: seconds each side of a harness run may take to come up (XLKV_SETUP_TIMEOUT overrides): P, D and a refused
#: peer each import vLLM at once, which took over the harness's own 180 s on a loaded 2-core machine; the
#: harness goes on as soon as a side is ready, so the bound costs nothing where the machine is not loaded
SETUP_TIMEOUT = 600


def harness(python, tmp_path, name, *args, env=None, step_timeout=45):
    """One run of the P/D harness (tests/harness/pd_harness.py); its result dict plus ``_log``
    (the harness's stdout and stderr) and ``_text`` (errors, warnings and log: where a
    refusal's message can be)."""
    out = tmp_path / ("%s.json" % name)
    env = dict(env or {})
    env.setdefault("XLKV_SETUP_TIMEOUT", os.environ.get("XLKV_SETUP_TIMEOUT") or str(SETUP_TIMEOUT))
    if not ({"XLKV_P_PORT", "XLKV_D_PORT"} & (set(env) | set(os.environ)) or {"--p-port", "--d-port"} & set(args)):
        base = free_ports()
        env.update(XLKV_P_PORT=str(base), XLKV_D_PORT=str(base + 1))
    r = run_in(python, [HARNESS, "--out", str(out), "--timeout", str(step_timeout)] + list(args), env=env,
               timeout=1500)  # under tests/real's 1800 s limit per test
    assert out.exists(), "harness wrote no result:\n" + r.stdout[-2000:] + r.stderr[-3000:]
    data = HarnessResult(json.loads(out.read_text()))
    data["_log"] = r.stdout + r.stderr
    data["_text"] = json.dumps(data.get("errors")) + json.dumps(data.get("warnings")) + data["_log"]
    return data


def release_of(vllm_env):
    """(major, minor) of the release under test."""
    return tuple(int(x) for x in vllm_env[0].split(".")[:2])
