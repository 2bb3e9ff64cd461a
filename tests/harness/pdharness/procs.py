"""Processes and ports (parent side): each side's environment with its NIXL side-channel
port, the spawned rank workers with their command and result queues, and waiting for
their answers."""
import multiprocessing as mp
import os
import queue as queue_mod
import time

from .worker import child_main, side_main


def fork_ranks():
    """Whether a side of several ranks forks them from one process that imported vLLM
    (worker.side_main; default) or spawns each on its own (XLKV_HARNESS_FORK_RANKS=0)."""
    return os.environ.get("XLKV_HARNESS_FORK_RANKS", "1").strip().lower() not in ("0", "false", "no", "off")


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


def side_in_netns(netns_name, *args):
    """--netns: a side's fork parent (worker.side_main) that first enters its network namespace."""
    from .netns import enter
    enter(netns_name)
    side_main(*args)


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
    """The rank workers of one run: one process per TP rank and side, each spawned, or those of a
    side with several ranks forked from one spawned process of that side (start_side)."""

    def __init__(self, args, tmpdir):
        self.ctx = mp.get_context("spawn")
        self.args, self.tmpdir = args, tmpdir
        self.procs = []
        self.netns = {}  # --netns: role -> network namespace its rank workers run in
        self.forked_sides = []  # roles whose ranks were forked from one process (start_side)

    def side(self, ranks):
        return Side(self.ctx, ranks)

    def start(self, role, side, index, env, rank=0, **overrides):
        """Rank ``rank`` of ``role`` on the queues ``side.cmd[index]``/``side.res[index]``."""
        ns = self.netns.get(role)
        return self._process(env, child_in_netns if ns else child_main,
                             ((ns,) if ns else ()) + (role, self._args(rank, overrides), self.tmpdir,
                                                      side.cmd[index], side.res[index], env))

    def start_side(self, role, side, env, ranks):
        """Every rank of one side: ``ranks`` = [rank number of index 0, of index 1, ...].  Several
        ranks are forked from one process that imports vLLM once (worker.side_main), unless
        XLKV_HARNESS_FORK_RANKS=0; one rank is spawned on its own as before."""
        if len(ranks) < 2 or not fork_ranks():
            return [self.start(role, side, i, env, rank) for i, rank in enumerate(ranks)]
        self.forked_sides.append(role)
        ns = self.netns.get(role)
        per_rank = [(self._args(rank, {}), side.cmd[i], side.res[i]) for i, rank in enumerate(ranks)]
        return [self._process(env, side_in_netns if ns else side_main,
                              ((ns,) if ns else ()) + (role, self.tmpdir, env, per_rank))]

    def _args(self, rank, overrides):
        return dict(vars(self.args), tp_rank=rank, **overrides)

    def _process(self, env, target, args):
        saved = dict(os.environ)
        os.environ.update(env)  # so that interpreter-startup hooks (.pth) see it too
        try:
            p = self.ctx.Process(target=target, args=args, daemon=True)
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
