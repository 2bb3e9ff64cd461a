"""The handoff levers' own logic, without vLLM (their real check: tests/real/test_handoff_levers.py;
the basenames differ because pytest imports test files as top-level modules).

kv_receive_notice.wait_for_reads polls until no read is in progress or the bound passes;
kv_load_start's two wrappers post a step's loads once, at bind, and only with the knob on."""

import pytest

from xlkv_autopatch.errors import XlkvFlagError
from xlkv_autopatch.patches import kv_load_start, kv_receive_notice


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_wait_returns_at_once_when_nothing_is_in_progress():
    clock = Clock()
    waited, done = kv_receive_notice.wait_for_reads(lambda h: "DONE", {"r": [1, 2]}, clock=clock, sleep=clock.sleep)
    assert (waited, done) == (0.0, True)


def test_wait_stops_when_the_last_read_completes():
    clock = Clock()
    finish = {1: 0.001, 2: 0.003}  # handle -> completion time (s)
    check = lambda h: "DONE" if clock.t >= finish[h] else "PROC"  # noqa: E731
    waited, done = kv_receive_notice.wait_for_reads(check, {"a": [1], "b": [2]}, wait_s=0.005, poll_s=0.0005,
                                                    clock=clock, sleep=clock.sleep)
    assert done is True and 0.003 <= waited < 0.0036


def test_wait_is_bounded():
    clock = Clock()
    waited, done = kv_receive_notice.wait_for_reads(lambda h: "PROC", {"a": [(7, 0.0)]}, wait_s=0.005,
                                                    poll_s=0.001, clock=clock, sleep=clock.sleep)
    assert done is False and 0.005 <= waited < 0.0061


def test_zero_twelve_pairs_are_polled_by_their_handle():
    seen = []
    kv_receive_notice.wait_for_reads(lambda h: seen.append(h) or "DONE", {"a": [(7, 1.5), (8, 1.6)]})
    assert seen == [7, 8]


class Agent:
    def __init__(self, states):
        self.states, self.calls = states, 0

    def check_xfer_state(self, h):
        self.calls += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


class Worker:
    def __init__(self, agent, recving):
        self.nixl_wrapper, self._recving_transfers = agent, recving


def _pop(transfers):
    return "original", transfers


def test_notice_wrapper_waits_only_for_receives_and_only_with_the_knob(monkeypatch):
    agent = Agent(["PROC", "PROC", "DONE"])
    w = Worker(agent, {"r": [1]})
    monkeypatch.delenv("XLKV_NOTICE_WAIT", raising=False)
    assert kv_receive_notice.pop_wrapper(_pop, w, (w._recving_transfers,), {}) == ("original", {"r": [1]})
    assert agent.calls == 0  # off by default
    monkeypatch.setenv("XLKV_NOTICE_WAIT", "1")
    assert kv_receive_notice.pop_wrapper(_pop, w, ({"s": [1]},), {})[0] == "original"
    assert agent.calls == 0  # sends are vLLM's
    assert kv_receive_notice.pop_wrapper(_pop, w, (w._recving_transfers,), {})[0] == "original"
    assert agent.calls == 3  # polled until DONE
    monkeypatch.setenv("XLKV_NOTICE_WAIT", "maybe")
    with pytest.raises(XlkvFlagError, match="XLKV_NOTICE_WAIT='maybe'"):
        kv_receive_notice.pop_wrapper(_pop, w, (w._recving_transfers,), {})


class Meta:
    def __init__(self, reqs):
        self.reqs_to_recv = reqs


class Connector:
    """Binds like KVConnectorBase_V1 and posts like NixlConnector.start_load_kv (via the wrappers)."""

    def __init__(self, zeroing=False):
        self.connector_worker = object()
        self._connector_metadata = None
        self.posted = []
        self._kv_cache_config = type("C", (), {"needs_kv_cache_zeroing": zeroing})()

    def bind_connector_metadata(self, md):
        kv_load_start.bind_wrapper(self._bind, self, (md,), {})

    def _bind(self, md):
        self._connector_metadata = md

    def start_load_kv(self, forward_context):
        kv_load_start.start_wrapper(self._start, self, (forward_context,), {})

    def _start(self, forward_context):
        self.posted.append(self._connector_metadata)


def _step(conn, md):
    """What vLLM 0.29+'s runner does: bind, forward launch, start_load_kv."""
    conn.bind_connector_metadata(md)
    posted_before_forward = list(conn.posted)
    conn.start_load_kv(None)
    return posted_before_forward


@pytest.mark.parametrize("value", [None, "0"])
def test_load_start_off_is_vllms_order(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("XLKV_EARLY_LOAD", raising=False)
    else:
        monkeypatch.setenv("XLKV_EARLY_LOAD", value)
    conn, md = Connector(), Meta({"r": 1})
    assert _step(conn, md) == [] and conn.posted == [md]


def test_load_start_on_posts_once_at_bind(monkeypatch):
    monkeypatch.setenv("XLKV_EARLY_LOAD", "1")
    conn = Connector()
    mds = [Meta({"r": 1}), Meta({}), Meta({"q": 2})]
    for md in mds:
        assert _step(conn, md)[-1] is md  # posted before the forward
    assert conn.posted == mds  # each step's metadata exactly once
    conn.bind_connector_metadata(mds[-1])  # the same object bound again: not posted again
    conn.start_load_kv(None)
    assert conn.posted == mds


def test_load_start_keeps_vllms_order_where_blocks_are_zeroed(monkeypatch):
    monkeypatch.setenv("XLKV_EARLY_LOAD", "1")
    conn, md = Connector(zeroing=True), Meta({"r": 1})
    assert _step(conn, md) == [] and conn.posted == [md]


def test_load_start_leaves_scheduler_side_connectors_alone(monkeypatch):
    monkeypatch.setenv("XLKV_EARLY_LOAD", "1")
    conn, md = Connector(), Meta({"r": 1})
    conn.connector_worker = None
    assert _step(conn, md) == [] and conn.posted == [md]
