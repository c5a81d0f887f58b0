"""Loaded (PYTHONPATH) only by test processes whose wall clock libfaketime sets off, with their
monotonic clock left real (FAKETIME_DONT_FAKE_MONOTONIC=1: faked, every timed wait of a thread,
which Python makes with sem_clockwait on the monotonic clock and libfaketime does not wrap,
lasts the skew longer or not at all). libfaketime 0.9.10 (Debian 12) then makes
clock_nanosleep on the monotonic clock fail with EINVAL, and Python's time.sleep uses it: here
time.sleep waits as a thread's timed wait does. Nothing else changes; no product code is
touched (tests/monitor/pipeline/test_remote_region.py)."""

from __future__ import annotations

import threading
import time

_never = threading.Event()


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _never.wait(seconds)


time.sleep = _sleep
