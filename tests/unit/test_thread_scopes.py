"""The shim's thread scopes (patches/_state.py): a scope one thread opens is that thread's alone.

vLLM's NIXL worker runs handshakes on a background thread (its handshake executor) while the engine's
own thread keeps stepping; the head-slicing scope that handshake.py opens around one worker's
``add_remote_agent`` must change block_contiguous.py's answer there only, never for a thread that
reads ``KVCacheLayout.is_block_contiguous`` at the same time.  Each test below holds a scope open in
one real thread while a second real thread asks."""

import threading
import types

import pytest

from xlkv_autopatch.patches import _state, block_contiguous

WAIT = 10.0  # seconds a thread waits for the other; a step here takes microseconds


def _vllm_is_block_contiguous(member):
    """vLLM 0.29+'s own test: the last three physical dimensions are H, N, C."""
    return member.name in ("LBHNC", "BLHNC")


def _ask(name):
    member = types.SimpleNamespace(name=name)
    return block_contiguous.contiguous_wrapper(_vllm_is_block_contiguous, member, (member,), {})


def _while_open(scope, ask):
    """Opens ``scope`` in a second thread and, while it is open there, returns (``ask()`` in this
    thread, ``ask()`` in the second thread inside the scope, ``ask()`` here after it closed)."""
    opened, asked, errors, inside = threading.Event(), threading.Event(), [], []

    def holder():
        try:
            with scope:
                inside.append(ask())
                opened.set()
                if not asked.wait(WAIT):
                    errors.append("the main thread did not ask within %.0f s" % WAIT)
        except BaseException as e:  # reported in the main thread
            errors.append(repr(e))
            opened.set()

    t = threading.Thread(target=holder, name="xlkv-test-scope-holder")
    t.start()
    try:
        assert opened.wait(WAIT), "the second thread did not open the scope within %.0f s" % WAIT
        here = ask()
    finally:
        asked.set()
        t.join(WAIT)
    assert not t.is_alive() and errors == [], errors
    return here, inside[0], ask()


def test_the_head_slicing_scope_of_one_thread_is_not_seen_by_another():
    here, there, after = _while_open(_state.head_slicing(), _state.head_slicing_now)
    assert (here, there, after) == (False, True, False)
    # what vLLM's gate gets: BHLNC passes only in the thread that opened the scope
    here, there, after = _while_open(_state.head_slicing(), lambda: _ask("BHLNC"))
    assert (here, there, after) == (False, True, False)
    # vLLM's own answers stand everywhere (the token-major rows stay refused inside the scope too)
    assert _while_open(_state.head_slicing(), lambda: (_ask("LBHNC"), _ask("BLNHC"))) == (
        (True, False), (True, False), (True, False))


def test_the_packing_scope_of_one_thread_is_not_seen_by_another():
    assert _while_open(_state.packing(), _state.packing_now) == (False, True, False)


@pytest.mark.parametrize("scope", [_state.head_slicing, _state.packing])
def test_a_scope_nests_and_closes_on_an_exception(scope):
    now = {_state.head_slicing: _state.head_slicing_now, _state.packing: _state.packing_now}[scope]
    with scope():
        with scope():
            assert now()
        assert now()  # the inner exit leaves the outer scope open
    assert not now()
    with pytest.raises(RuntimeError):
        with scope():
            raise RuntimeError("a failed handshake")
    assert not now()
