"""--netns: P and D as two hosts on one machine.  P's rank workers (and a refused second
prefill's) run in one network namespace, D's in another, joined by a veth pair; each side
has its own address, and nothing of P's is reachable from D but over that pair.  vLLM's NIXL
side channel binds the side's address (VLLM_NIXL_SIDE_CHANNEL_HOST) and NIXL moves the
blocks with UCX's TCP transport over the veth (UCX_TLS=tcp: no CMA or shared memory between
the processes; UCX_NET_DEVICES=the veth).  Each namespace brings its own ``lo`` up for the
side's gloo group (GLOO_SOCKET_IFNAME=lo, file rendezvous).

Names carry the parent's pid (xlkv-<pid>-p/-d, veth xk<pid>p/d), so concurrent runs never
clash; close() removes them however the run ended, and a run first removes the namespaces of
runs whose parent is gone (a parent killed by a timeout cannot clean up).  Needs root (or
CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; tc for --link-flap's throttle.

Module level is stdlib only: spawned rank workers import it (enter())."""
import atexit
import ctypes
import json
import os
import re
import subprocess
import time

ADDRS = {"p": "10.231.0.1", "d": "10.231.0.2"}
PREFIX_LEN = 24
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_REC, MS_SLAVE, MNT_DETACH = 0x4000, 0x80000, 2
NS_DIR = "/var/run/netns"


def _ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def enter(name):
    """In a rank worker, before anything starts a thread: move this process into network
    namespace ``name`` (threads it starts later inherit it), and give it a sysfs of that
    namespace, as ``ip netns exec`` does: UCX lists network devices under /sys/class/net, which
    otherwise still shows the parent's namespace (UCX: "network device ... is not available")."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc, what):
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} ({name}): {os.strerror(err)}")

    fd = os.open(os.path.join(NS_DIR, name), os.O_RDONLY)
    try:
        check(libc.setns(fd, CLONE_NEWNET), "setns")
    finally:
        os.close(fd)
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # nothing mounted here propagates back to the machine's mount namespace
    check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    libc.umount2(b"/sys", MNT_DETACH)
    check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mount sysfs")


def unavailable():
    """Why network namespaces cannot be made here (None when they can): tried, not guessed."""
    probe = f"xlkv-{os.getpid()}-probe"
    try:
        r = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"iproute2's ip cannot run: {e}"
    if r.returncode != 0:
        return f"'ip netns add' failed ({r.stderr.strip() or r.returncode}): needs root or CAP_SYS_ADMIN"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale():
    """Removes the namespaces of runs whose parent process is gone; returns their names."""
    r = _ip("netns", "list", check=False)
    gone = []
    for line in r.stdout.splitlines():
        m = re.match(r"(xlkv-(\d+)-\w+)", line.strip())
        if m and not _alive(int(m.group(2))):
            _ip("netns", "del", m.group(1), check=False)
            gone.append(m.group(1))
    return gone


class NetnsPair:
    """Two namespaces joined by a veth pair: ``ns[side]``, ``dev[side]``, ``addr[side]``
    (side "p" or "d")."""

    def __init__(self):
        pid = os.getpid()
        self.ns = {s: f"xlkv-{pid}-{s}" for s in ("p", "d")}
        self.dev = {s: f"xk{pid}{s}" for s in ("p", "d")}
        self.addr = dict(ADDRS)
        self.events = []  # link changes, with times relative to creation
        self.t0 = time.time()
        self.stale_removed = sweep_stale()
        atexit.register(self.close)  # also when the parent exits between here and the run's finally
        try:
            for s in ("p", "d"):
                _ip("netns", "add", self.ns[s])
            _ip("link", "add", self.dev["p"], "type", "veth", "peer", "name", self.dev["d"])
            for s in ("p", "d"):
                _ip("link", "set", self.dev[s], "netns", self.ns[s])
                _ip("-n", self.ns[s], "addr", "add", f"{self.addr[s]}/{PREFIX_LEN}", "dev", self.dev[s])
                _ip("-n", self.ns[s], "link", "set", "lo", "up")
                _ip("-n", self.ns[s], "link", "set", self.dev[s], "up")
        except Exception:
            self.close()
            raise

    def env(self, side):
        """What a side's rank workers need in their environment (before --p-env/--d-env, which
        may override it)."""
        return {"VLLM_NIXL_SIDE_CHANNEL_HOST": self.addr[side], "UCX_TLS": "tcp",
                "UCX_NET_DEVICES": self.dev[side], "GLOO_SOCKET_IFNAME": "lo"}

    def counters(self, sides=("p", "d")):
        """{side: {"rx_bytes", "tx_bytes", "rx_packets", "tx_packets"}} of each veth end (of ``sides``)."""
        out = {}
        for s in sides:
            r = _ip("-n", self.ns[s], "-s", "-j", "link", "show", "dev", self.dev[s])
            st = json.loads(r.stdout)[0]["stats64"]
            out[s] = {"rx_bytes": st["rx"]["bytes"], "tx_bytes": st["tx"]["bytes"],
                      "rx_packets": st["rx"]["packets"], "tx_packets": st["tx"]["packets"]}
        return out

    @staticmethod
    def delta(before, after):
        return {s: {k: after[s][k] - before[s][k] for k in after[s]} for s in after}

    def set_link(self, up):
        """P's end of the veth down or up (the peer loses its carrier with it)."""
        _ip("-n", self.ns["p"], "link", "set", self.dev["p"], "up" if up else "down")
        self.events.append((round(time.time() - self.t0, 3), "up" if up else "down"))

    def throttle(self, rate):
        """Limits P's egress (the blocks D reads) to ``rate`` (tc tbf, e.g. "256kbit")."""
        subprocess.run(["ip", "netns", "exec", self.ns["p"], "tc", "qdisc", "add", "dev", self.dev["p"],
                        "root", "tbf", "rate", rate, "burst", "16kb", "latency", "5s"],
                       check=True, capture_output=True, timeout=30)

    def unthrottle(self):
        subprocess.run(["ip", "netns", "exec", self.ns["p"], "tc", "qdisc", "del", "dev", self.dev["p"],
                        "root"], capture_output=True, timeout=30)

    def describe(self):
        return {"namespaces": dict(self.ns), "veth": dict(self.dev), "addresses": dict(self.addr),
                "stale_removed": self.stale_removed}

    def close(self):
        """Deletes both namespaces (the veth goes with them); safe to call twice."""
        for s in ("p", "d"):
            _ip("netns", "del", self.ns[s], check=False)
        _ip("link", "del", self.dev["p"], check=False)  # only if it never left this namespace

    def leftovers(self):
        """This run's namespaces still listed (for the result: must be empty after close())."""
        listed = _ip("netns", "list", check=False).stdout
        return [n for n in self.ns.values() if re.search(rf"^{re.escape(n)}\b", listed, re.M)]


# --link-flap: the request whose read the link drops under (P blocks, D blocks), and the
# request after it (D must serve it over the restored link); D blocks no case writes but
# "reversed", which rewrites them with their new owners
FLAP_REQUEST = ("f", list(range(8, 16)), list(range(32, 40)))
AFTER_FLAP = ("g", [3, 19, 27], [12, 13, 10])
UNDER_WAY_BYTES = 64 * 1024  # P's veth sent this much of the read before the link goes down


def link_flap(run, down_s, rate):
    """After the cases: P's egress throttled to ``rate``, D pulls FLAP_REQUEST, and once part
    of it crossed the veth the link goes down for ``down_s`` seconds, then up again.  The
    outcome (whatever it is: vLLM's, stock or flagged) goes to result["link_flap"]; then
    AFTER_FLAP over the restored link must arrive byte for byte (result["after_flap"]).
    Returns whether it did."""
    net, result = run.net, run.result
    suffix, remote, local = FLAP_REQUEST
    c = {"down_s": down_s, "rate": rate}
    before = net.counters()

    def during():
        t = time.time()
        sent = 0
        while time.time() - t < 10:
            sent = net.counters(("p",))["p"]["tx_bytes"] - before["p"]["tx_bytes"]  # one `ip` call a poll
            if sent >= UNDER_WAY_BYTES:
                break
            time.sleep(0.01)
        c["sent_before_down"] = sent
        net.set_link(False)
        time.sleep(down_s)
        net.set_link(True)

    net.throttle(rate)
    try:
        run._transfer(c, "req-flap-" + suffix, remote, local, during=during)
    except Exception as e:
        c["ok"] = False
        c["error"] = f"{type(e).__name__}: {e}"[:3000]
    finally:
        net.unthrottle()
        c["veth"] = NetnsPair.delta(before, net.counters())
        c["link_events"] = list(net.events)
    result["link_flap"] = c
    suffix, remote, local = AFTER_FLAP
    c2 = {}
    try:
        run._transfer(c2, "req-after-flap-" + suffix, remote, local)
    except Exception as e:
        c2["ok"] = False
        c2["error"] = f"{type(e).__name__}: {e}"[:3000]
    result["after_flap"] = c2
    return bool(c2.get("ok"))
