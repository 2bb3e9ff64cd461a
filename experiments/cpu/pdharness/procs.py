"""Processes and ports (parent side): each side's environment with its NIXL side-channel
port, the spawned rank workers with their command and result queues, and waiting for
their answers."""
import multiprocessing as mp
import os
import queue as queue_mod
import time

from .worker import child_main


def parse_env(items):
    """KEY=VAL items (--env, --p-env, ...) -> dict."""
    return dict(x.split("=", 1) for x in items)


def side_env(both, items, port, host="127.0.0.1", net=None):
    """One engine's environment: --env, its own KEY=VALs, its side-channel port on ``host``
    (--netns: ``net``, the namespace's settings, under both)."""
    return dict(dict(net or {}, **both), **parse_env(items), VLLM_NIXL_SIDE_CHANNEL_PORT=str(port),
                VLLM_NIXL_SIDE_CHANNEL_HOST=host)


def child_in_netns(netns_name, *args):
    """--netns: a rank worker that first enters its side's network namespace."""
    from .netns import enter
    enter(netns_name)
    child_main(*args)


def expect(q, kinds, timeout, what):
    """The next message of one of ``kinds`` from a rank's result queue (others are dropped);
    a rank's "fatal" raises with its traceback."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            msg = q.get(timeout=max(0.05, end - time.time()))
        except queue_mod.Empty:
            break
        if msg[0] == "fatal":
            raise RuntimeError(f"{what}: child died: {msg[1]['error']}\n{msg[1]['traceback']}"
                               f"\nlog errors: {msg[1].get('log_errors')}")
        if msg[0] in kinds:
            return msg
    raise TimeoutError(f"{what}: no {kinds} within {timeout}s")


class Side:
    """One engine's rank workers: rank i reads cmd[i] and answers on res[i]."""

    def __init__(self, ctx, ranks):
        self.cmd = [ctx.Queue() for _ in range(ranks)]
        self.res = [ctx.Queue() for _ in range(ranks)]

    def put(self, msg):
        for q in self.cmd:
            q.put(msg)

    def expect_all(self, kinds, timeout, what):
        """Every rank's next message of one of ``kinds`` (its payload)."""
        n = len(self.res)
        return [expect(q, kinds, timeout, what + (f" (rank {i})" if n > 1 else ""))[1]
                for i, q in enumerate(self.res)]


class Ranks:
    """The spawned rank workers of one run (one process per TP rank and side)."""

    def __init__(self, args, tmpdir):
        self.ctx = mp.get_context("spawn")
        self.args, self.tmpdir = args, tmpdir
        self.procs = []
        self.netns = {}  # --netns: role -> network namespace its rank workers run in

    def side(self, ranks):
        return Side(self.ctx, ranks)

    def start(self, role, side, index, env, rank=0, **overrides):
        """Rank ``rank`` of ``role`` on the queues ``side.cmd[index]``/``side.res[index]``."""
        saved = dict(os.environ)
        os.environ.update(env)  # so that interpreter-startup hooks (.pth) see it too
        try:
            ns = self.netns.get(role)
            p = self.ctx.Process(target=child_in_netns if ns else child_main,
                                 args=((ns,) if ns else ()) + (role, dict(vars(self.args), tp_rank=rank, **overrides), self.tmpdir,
                                       side.cmd[index], side.res[index], env), daemon=True)
            p.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.procs.append(p)
        return p

    def join(self):
        for p in self.procs:
            p.join(timeout=10)
        for p in self.procs:
            if p.is_alive():
                p.kill()
