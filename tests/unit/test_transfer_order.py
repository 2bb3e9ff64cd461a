"""patches/transfer_order.py: the wrapper on a cross-layer worker's NIXL agent (narrow unit
tests with a recording stand-in for the agent; the real check is tests/real and the compat
matrix: real vLLM, real NIXL, bytes compared)."""

import pytest

from xlkv_autopatch.errors import XlkvFlagError
from xlkv_autopatch.patches import transfer_order


class Agent:
    """Records what make_prepped_xfer receives, as nixl_agent's signature names it."""

    def __init__(self):
        self.calls = []

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side, remote_indices,
                          notif_msg=b"", backends=[], skip_desc_merge=False):  # noqa: B006 - NIXL's own default
        self.calls.append((operation, list(local_indices), list(remote_indices), notif_msg, skip_desc_merge))
        return "handle"


class Worker:
    def __init__(self):
        self.nixl_wrapper = Agent()


def test_pairs_are_reordered_together_positionally_and_by_keyword(monkeypatch):
    monkeypatch.delenv(transfer_order.KNOB, raising=False)
    w = Worker()
    transfer_order.attach(w)
    assert w.nixl_wrapper.make_prepped_xfer("READ", 1, [7, 6, 5], 2, [17, 16, 15], notif_msg=b"n") == "handle"
    w.nixl_wrapper.make_prepped_xfer("WRITE", 1, local_indices=[9, 3], remote_xfer_side=2, remote_indices=[1, 2])
    assert w.nixl_wrapper.calls == [("READ", [5, 6, 7], [15, 16, 17], b"n", False),
                                    ("WRITE", [3, 9], [2, 1], b"", False)]


def test_numpy_ids_stay_numpy(monkeypatch):
    np = pytest.importorskip("numpy")
    monkeypatch.delenv(transfer_order.KNOB, raising=False)
    seen = []

    class NpAgent:
        def make_prepped_xfer(self, op, ls, li, rs, ri, notif_msg=b""):
            seen.append((type(li), li.tolist(), ri.tolist()))

    w = Worker()
    w.nixl_wrapper = NpAgent()
    transfer_order.attach(w)
    w.nixl_wrapper.make_prepped_xfer("READ", 1, np.array([3, 2, 1]), 2, np.array([13, 12, 11]))
    assert seen == [(np.ndarray, [1, 2, 3], [11, 12, 13])]


def test_left_alone_when_asked_or_not_understood(monkeypatch):
    monkeypatch.delenv(transfer_order.KNOB, raising=False)
    w = Worker()
    transfer_order.attach(w)
    a = w.nixl_wrapper
    a.make_prepped_xfer("READ", 1, [2, 1], 2, [4, 3], skip_desc_merge=True)  # NIXL told not to merge
    a.make_prepped_xfer("READ", 1, [2, 1, 0], 2, [4, 3])  # unequal lengths: NIXL's error, not ours
    assert [c[1:3] for c in a.calls] == [([2, 1], [4, 3]), ([2, 1, 0], [4, 3])]


def test_attached_once_and_not_at_all_when_turned_off(monkeypatch):
    monkeypatch.delenv(transfer_order.KNOB, raising=False)
    w = Worker()
    transfer_order.attach(w)
    first = w.nixl_wrapper.make_prepped_xfer
    transfer_order.attach(w)
    assert w.nixl_wrapper.make_prepped_xfer is first
    monkeypatch.setenv(transfer_order.KNOB, "false")
    w2 = Worker()
    transfer_order.attach(w2)
    w2.nixl_wrapper.make_prepped_xfer("READ", 1, [2, 1], 2, [4, 3])
    assert w2.nixl_wrapper.calls[0][1:3] == ([2, 1], [4, 3])
    transfer_order.attach(object())  # a worker without an agent: nothing to do


def test_unrecognised_knob_value_is_refused(monkeypatch):
    monkeypatch.setenv(transfer_order.KNOB, "maybe")
    with pytest.raises(XlkvFlagError, match="XLKV_COALESCE='maybe'"):
        transfer_order.attach(Worker())
    for value, on in (("", True), ("1", True), ("on", True), ("0", False), ("off", False)):
        assert transfer_order.enabled({transfer_order.KNOB: value}) is on


def test_first_reordered_transfer_is_logged_with_its_gain(monkeypatch, caplog):
    import logging
    from xlkv_autopatch import logs
    monkeypatch.delenv(transfer_order.KNOB, raising=False)
    monkeypatch.setattr(logs, "_seen", set())
    w = Worker()
    transfer_order.attach(w)
    with caplog.at_level(logging.INFO, logger="vllm.xlkv_autopatch"):
        w.nixl_wrapper.make_prepped_xfer("READ", 1, [7, 6, 5, 1], 2, [17, 16, 15, 3])
        w.nixl_wrapper.make_prepped_xfer("READ", 1, [9, 8], 2, [19, 18])
    lines = [r.getMessage() for r in caplog.records if "first reordered" in r.getMessage()]
    assert lines == ["xlkv_autopatch: first reordered NIXL transfer: 4 descriptor pairs, 4 contiguous runs in "
                     "vLLM's order, 2 after ordering"]
