"""KV receives on decode: a read that completes within a few milliseconds is noticed this step.

Why
    vLLM learns that a request's NIXL read finished only when the worker polls it
    (``_pop_done_transfers``, once per engine step, right after the step's forward was
    launched); a read that completes a moment after that poll waits a whole step, and the
    scheduler schedules the request a step later still.  On the P/D handoff that is part of
    "read noticed and first token" (issue 22; experiments/README.md).
How
    Under ``XLKV_NOTICE_WAIT=1`` (off by default; the ablation config ``shim-notice``): the
    worker's ``_pop_done_transfers`` is wrapped; when it is asked about the receives
    (``self._recving_transfers``) and some are still in progress, it polls their state with
    the agent's own ``check_xfer_state`` until none is in progress or :data:`WAIT_S` has
    passed, then calls the original, which polls, releases and reports as always.  Every
    NIXL call stays on the thread that already makes them (the worker's, inside vLLM's own
    call): no new thread touches the agent, so its thread-safety is not relied on.  A step
    with no read in flight is not delayed; one with reads in flight by at most WAIT_S.
    Sends (prefill side) and failed reads are left to vLLM.
vLLM versions
    0.12+ (``_pop_done_transfers(self, transfers)`` on the NIXL worker class; 0.12 keeps
    (handle, start time) pairs, later releases handles).
Removal
    When vLLM notices finished receives off the engine step (upstream RFC #50913,
    ``fast_kv_notify``; #57987).
"""

import time

from ..flag import knob
from ..logs import info_once

KNOB = "XLKV_NOTICE_WAIT"
#: the longest a step waits for reads in flight (seconds)
WAIT_S = 0.005
#: between two polls (seconds)
POLL_S = 0.0002
IN_PROGRESS = "PROC"


def enabled(environ=None):
    return knob(KNOB, environ)


def _handles(transfers):
    for items in list(transfers.values()):
        for item in items:
            yield item[0] if isinstance(item, tuple) else item


def wait_for_reads(check, transfers, wait_s=WAIT_S, poll_s=POLL_S, clock=time.perf_counter, sleep=time.sleep):
    """Poll ``check(handle)`` for every handle of ``transfers`` until none is in progress or
    ``wait_s`` passed; returns (seconds waited, whether all left progress).  Pure logic: the
    caller's ``check`` is the agent's check_xfer_state."""
    start = clock()
    while True:
        if all(check(h) != IN_PROGRESS for h in _handles(transfers)):
            return clock() - start, True
        waited = clock() - start
        if waited >= wait_s:
            return waited, False
        sleep(poll_s)


def pop_wrapper(wrapped, instance, args, kwargs):
    """Wait up to WAIT_S for the receives in flight, then let vLLM poll them (XLKV_NOTICE_WAIT=1)."""
    transfers = args[0] if args else kwargs.get("transfers")
    recving = getattr(instance, "_recving_transfers", None)
    agent = getattr(instance, "nixl_wrapper", None)
    if transfers is None or transfers is not recving or not transfers or agent is None or not enabled():
        return wrapped(*args, **kwargs)
    waited, done = wait_for_reads(agent.check_xfer_state, transfers)
    info_once("notice-wait", "XLKV_NOTICE_WAIT=1: the worker waits up to %.1f ms per step for KV reads in flight "
              "before reporting (first: %d request(s), %.2f ms, %s)", WAIT_S * 1e3, len(transfers), waited * 1e3,
              "all complete" if done else "some still in flight")
    return wrapped(*args, **kwargs)
