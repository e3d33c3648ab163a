"""What a test stuck past pytest-timeout's bound leaves behind, written so the end of the output names it.

pytest-timeout's thread method writes the captured output first and every thread's stack after it,
then ends the process. For an async test that is not enough: the main thread's stack only says that
the event loop waits in `select`, and a CI log that keeps the last part of the output loses both the
test's name and its log. This timer writes every thread's stack, then the stack of every task still
pending on a running event loop (where the test actually waits), then the last records of the
test's log, and last of all the test's id; then it ends the process as pytest-timeout does.

pytest-timeout also cancels the timer as soon as a test fails (to leave a debugger alone), so a
failed test's teardown would have no bound at all; here the timer runs until the test's whole
protocol (teardown included) has finished, unless a debugger was asked for.
"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
import os
import sys
import threading
import traceback
from typing import Any

import pytest

LOG_TAIL_RECORDS = 80


def _thread_stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    me = threading.get_ident()
    out = io.StringIO()
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 (documented in the sys module)
        if ident == me:
            continue
        out.write(f"--- thread {names.get(ident, '?')} ({ident})\n")
        out.write("".join(traceback.format_stack(frame)))
    return out.getvalue()


def _await_chain(coro: Any) -> traceback.StackSummary:
    """The frames from a task's coroutine down the chain it awaits (asyncio's stack stops at the first)."""
    frames = []
    while coro is not None:
        frame = (
            getattr(coro, "cr_frame", None)
            or getattr(coro, "gi_frame", None)
            or getattr(coro, "ag_frame", None)
        )
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "gi_yieldfrom", None)
            or getattr(coro, "ag_await", None)
        )
    return traceback.StackSummary.extract(iter(frames))


def _task_stacks() -> str:
    out = io.StringIO()
    loops = [obj for obj in gc.get_objects() if isinstance(obj, asyncio.AbstractEventLoop)]
    for loop in loops:
        if not loop.is_running():
            continue
        for task in list(asyncio.all_tasks(loop)):
            out.write(f"--- task {task!r}\n")
            out.write("".join(_await_chain(task.get_coro()).format()))
    return out.getvalue()


def _log_tail(item: pytest.Item) -> str:
    from _pytest.logging import caplog_handler_key

    handler = item.stash.get(caplog_handler_key, None)
    if handler is None:
        return ""
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(threadName)s %(message)s")
    records = list(handler.records)[-LOG_TAIL_RECORDS:]
    return "".join(formatter.format(record) + "\n" for record in records)


def _report_and_exit(item: pytest.Item, timeout: float) -> None:
    terminal = item.config.get_terminal_writer()
    try:
        capman: Any = item.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            capman.suspend_global_capture(item)
        for title, text in (
            ("threads", _thread_stacks()),
            ("pending asyncio tasks", _task_stacks()),
            (f"last {LOG_TAIL_RECORDS} log records", _log_tail(item)),
        ):
            terminal.sep("~", title=title)
            terminal.write(text)
        terminal.sep("+", title=f"TIMEOUT after {timeout:g} s: {item.nodeid}")
    except Exception:  # a report that fails must still end the run
        traceback.print_exc()
    finally:
        terminal.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest_timeout_set_timer for the thread method (others are left to pytest-timeout)."""
    if settings.method != "thread" or not settings.timeout:
        return None
    timer = threading.Timer(settings.timeout, _report_and_exit, (item, settings.timeout))
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # read by pytest-timeout's cancel hook
    timer.start()
    return True


_finished: set[str] = set()


def protocol_finished(nodeid: str) -> None:
    """pytest_runtest_logfinish: the test's setup, call and teardown are over."""
    _finished.add(nodeid)


def cancel_timer(item: pytest.Item) -> bool | None:
    """pytest_timeout_cancel_timer: True (the timer kept) while the test still runs, without --pdb."""
    if item.nodeid in _finished or item.config.getoption("usepdb", False):
        return None  # pytest-timeout's own hook cancels it
    return True


HANG_S = 60.0
"""The ceiling of a wait for something a test brings about (a watch event, a log line, a process's
exit): generous enough that only a hang reaches it on a slow or loaded machine, and half of the
per-test bound, so a test that waits in vain fails with its own message rather than the timer's."""
