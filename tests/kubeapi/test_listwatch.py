"""The one reflector against the stand-in API server through the real client: paged lists reduced page
by page, an expired continue token, watch resume and bookmarks, 410 relist, backoff, stop from another
thread, and the arguments it refuses.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube, WatchInterrupt, load_api_client
from kube_vgpu.kubeapi.listwatch import (
    Backoff,
    Handlers,
    KubeSource,
    Listed,
    ProgressReason,
    Reflector,
    WatchEvent,
)
from kube_vgpu.kubeapi.rawlist import contains_any
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.timeouts import HANG_S


def pod(name: str, *, gpu: bool = False) -> dict[str, Any]:
    limits = {"volcano.sh/vgpu-number": "1"} if gpu else {"cpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


class Recorder:
    """Handlers that record what the reflector reports, in order, with a way to wait for it."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.lists: list[Listed[str]] = []
        self.events: list[WatchEvent[str]] = []
        self.progress: list[ProgressReason] = []
        self.failures: list[BaseException] = []
        self.changed = threading.Condition()

    def handlers(self) -> Handlers[str]:
        def listed(result: Listed[str]) -> None:
            self._add("listed", result, self.lists)

        def event(change: WatchEvent[str]) -> None:
            self._add("event", change, self.events)

        def progress(reason: ProgressReason, at: float) -> None:
            self._add("progress", reason, self.progress)

        def failed(exc: BaseException) -> None:
            self._add("failed", exc, self.failures)

        return Handlers(listed=listed, event=event, progress=progress, failed=failed)

    def _add(self, what: str, item: Any, into: list[Any]) -> None:
        with self.changed:
            into.append(item)
            self.log.append((what, item))
            self.changed.notify_all()

    def wait(self, condition: Callable[[], bool], what: str, limit_s: float = HANG_S) -> None:
        with self.changed:
            assert self.changed.wait_for(condition, limit_s), what


class Hooked:
    """A KubeSource that records each page read and runs a hook after it (the test's moment)."""

    def __init__(self, source: KubeSource, log: list[tuple[str, Any]]) -> None:
        self.source = source
        self.log = log
        self.after_page: Callable[[int], None] = lambda n: None
        self.pages = 0

    @property
    def filtered(self) -> bool:
        return self.source.filtered

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        return self._page(lambda: self.source.list_page(limit, continue_token))

    def list_page_raw(self, limit: int, continue_token: str | None) -> bytes:
        page: bytes = self._page(lambda: self.source.list_page_raw(limit, continue_token))
        return page

    def _page(self, read: Callable[[], Any]) -> Any:
        self.pages += 1
        self.log.append(("page", self.pages))
        page = read()
        self.after_page(self.pages)
        return page

    def watch(
        self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        return self.source.watch(resource_version, interrupt, timeout_seconds)


@pytest.fixture
def kube(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[Kube]:
    client = Kube(load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))))
    yield client
    client.close()


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


class Running:
    """A reflector on a thread of its own, stopped (and joined) at the end of the test."""

    def __init__(self, reflector: Reflector[Any]) -> None:
        self.reflector = reflector
        self.thread = threading.Thread(target=reflector.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop the reflector; it must end on its own (a wait it is in is cut short, not waited out)."""
        self.reflector.stop()
        self.thread.join(HANG_S)
        assert not self.thread.is_alive(), "the reflector did not stop"


def reflector(
    source: Any, recorder: Recorder, transform: Callable[[dict[str, Any]], str | None] = name_of, **kw: Any
) -> Reflector[str]:
    kw.setdefault("backoff", Backoff(initial=0.02, maximum=0.1))
    return Reflector(source, recorder.handlers(), transform=transform, name="test", **kw)


def test_a_list_is_read_in_pages_each_reduced_before_the_next_is_read(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    for index in range(5):
        apiserver.put(pod(f"p{index}"))
    recorder = Recorder()
    source = Hooked(KubeSource(kube, "pod"), recorder.log)

    def transform(obj: dict[str, Any]) -> str:
        recorder.log.append(("transform", name_of(obj)))
        return name_of(obj)

    running = Running(reflector(source, recorder, transform, page_size=2))
    recorder.wait(lambda: bool(recorder.lists), "the list")
    running.stop()
    listed = recorder.lists[0]
    assert [name for _, name in listed.items] == ["p0", "p1", "p2", "p3", "p4"]
    assert (listed.pages, listed.read) == (3, 5)
    steps = [entry for entry in recorder.log if entry[0] in ("page", "transform")]
    assert steps == [
        ("page", 1), ("transform", "p0"), ("transform", "p1"),
        ("page", 2), ("transform", "p2"), ("transform", "p3"),
        ("page", 3), ("transform", "p4"),
    ]  # fmt: skip
    lists = [r for r in apiserver.requests("GET", "/api/v1/pods") if r.query.get("watch") is None]
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    assert "continue" not in lists[0].query and all(r.query.get("continue") for r in lists[1:])


def test_a_prefilter_decodes_only_the_items_that_can_be_kept(apiserver: ApiServerStandin, kube: Kube) -> None:
    for index in range(7):
        apiserver.put(pod(f"p{index}", gpu=index % 3 == 0))
    recorder = Recorder()
    decoded: list[str] = []

    def transform(obj: dict[str, Any]) -> str | None:
        decoded.append(name_of(obj))
        limits = obj["spec"]["containers"][0]["resources"]["limits"]
        return name_of(obj) if "volcano.sh/vgpu-number" in limits else None

    running = Running(
        reflector(
            KubeSource(kube, "pod"),
            recorder,
            transform,
            page_size=3,
            prefilter=contains_any(("volcano.sh/vgpu-number",)),
        )
    )
    recorder.wait(lambda: bool(recorder.lists), "the list")
    running.stop()
    listed = recorder.lists[0]
    assert [name for _, name in listed.items] == ["p0", "p3", "p6"]
    assert decoded == ["p0", "p3", "p6"]  # the others were never decoded
    # Every page was split (two full pages, and the last holding what the second said remained).
    assert (listed.pages, listed.read, running.reflector.pages_split) == (3, 7, 3)


def test_an_expired_continue_token_restarts_the_list_from_its_first_page(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    for index in range(4):
        apiserver.put(pod(f"p{index}"))
    recorder = Recorder()
    source = Hooked(KubeSource(kube, "pod"), recorder.log)

    def compact(page: int) -> None:
        if page == 1:  # between the first and second page: a write, then etcd compacts past it
            apiserver.put(pod("p9"))
            apiserver.delete("Pod", "p3", "default")
            apiserver.expire_history()

    source.after_page = compact
    running = Running(reflector(source, recorder, page_size=2))
    recorder.wait(lambda: bool(recorder.lists), "the list")
    running.stop()
    assert [name for _, name in recorder.lists[0].items] == ["p0", "p1", "p2", "p9"]
    assert running.reflector.expired_continues == 1 and source.pages == 4  # 1 expired + 3 fresh


def test_the_watch_follows_the_list_resumes_after_its_end_and_reports_bookmarks(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    apiserver.put(pod("before"))
    recorder = Recorder()
    running = Running(reflector(KubeSource(kube, "pod"), recorder, watch_timeout_seconds=1))
    recorder.wait(lambda: bool(recorder.lists), "the list")
    apiserver.put(pod("after"))
    recorder.wait(lambda: any(e.key == "default/after" for e in recorder.events), "the ADDED event")
    recorder.wait(lambda: "stream_end" in recorder.progress, "a watch ended by the server")
    apiserver.delete("Pod", "before", "default")
    recorder.wait(lambda: any(e.type == "DELETED" for e in recorder.events), "the DELETED event")

    def bookmarked() -> bool:
        apiserver.send_bookmarks()  # again until a watch is open to take one (they last a second)
        return "bookmark" in recorder.progress

    recorder.wait(bookmarked, "a bookmark")
    running.stop()
    assert len(recorder.lists) == 1 and running.reflector.relists_gone == 0  # resumed, never relisted
    watches = [r for r in apiserver.requests("GET", "/api/v1/pods") if r.query.get("watch") == "true"]
    assert len(watches) >= 2 and all(r.query.get("allowWatchBookmarks") == "true" for r in watches)
    # Each watch resumes where the previous stream stopped, never from the list's version again.
    versions = [int(r.query["resourceVersion"]) for r in watches]
    assert versions == sorted(versions) and versions[-1] > versions[0]


def test_410_gone_relists_and_the_relist_no_longer_holds_what_was_deleted(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    apiserver.put(pod("stays"))
    apiserver.put(pod("goes"))
    recorder = Recorder()
    running = Running(reflector(KubeSource(kube, "pod"), recorder))
    recorder.wait(lambda: bool(recorder.lists), "the first list")
    apiserver.set_outage(True)
    apiserver.delete("Pod", "goes", "default")
    apiserver.put(pod("new"))
    apiserver.expire_history()
    apiserver.set_outage(False)
    recorder.wait(lambda: len(recorder.lists) == 2, "the relist after 410")
    running.stop()
    assert [name for _, name in recorder.lists[1].items] == ["new", "stays"]
    assert running.reflector.relists_gone >= 1


def test_stop_from_another_thread_ends_a_watch_blocked_on_a_silent_stream(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    recorder = Recorder()
    # The server would end the watch after an hour: past the bound of the join in `stop`.
    running = Running(reflector(KubeSource(kube, "pod"), recorder, watch_timeout_seconds=3600))
    recorder.wait(lambda: bool(recorder.lists), "the list")

    def watching() -> bool:
        return any(r.query.get("watch") in ("true", "1") for r in apiserver.requests("GET", "/api/v1/pods"))

    until(watching, "the watch is open (and silent)")
    running.stop()


def test_a_stop_during_the_backoff_ends_it_at_once(apiserver: ApiServerStandin, kube: Kube) -> None:
    apiserver.set_outage(True)
    recorder = Recorder()
    # An hour's wait: past the bound of the join in `stop`, so only a stop that cuts it short passes.
    backoff = Backoff(initial=3600, maximum=3600)
    running = Running(reflector(KubeSource(kube, "pod"), recorder, backoff=backoff))
    recorder.wait(lambda: bool(recorder.failures), "a failed list")
    running.stop()


def test_backoff_grows_to_its_maximum_with_jitter_on_top() -> None:
    backoff = Backoff(initial=1, maximum=8, factor=2, jitter=0.5, rng=random.Random(7))
    for attempt, base in enumerate([1, 2, 4, 8, 8, 8]):
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(base <= d <= base * 1.5 for d in delays)
        assert max(delays) - min(delays) > base * 0.3  # jittered, not constant
    assert Backoff(initial=1, maximum=1, jitter=0).delay(100) == 1


def test_refused_settings_name_what_is_wrong() -> None:
    Backoff(initial=0.5, maximum=0.5, factor=1, jitter=0, reset_after=1e-9)  # the edges are accepted
    cases: list[tuple[dict[str, float], str]] = [
        ({"initial": 0}, "0 < initial <= maximum"),
        ({"initial": 2, "maximum": 1}, "0 < initial <= maximum"),
        ({"factor": 0.99}, "factor >= 1"),
        ({"jitter": -0.01}, "jitter >= 0"),
        ({"reset_after": 0}, "reset_after > 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            Backoff(**kwargs)  # type: ignore[arg-type]
    source = KubeSource(None, "pod")  # type: ignore[arg-type]  # never called
    Reflector(
        source, Recorder().handlers(), transform=name_of, name="t", page_size=1, watch_timeout_seconds=1
    )
    with pytest.raises(ValueError, match="page_size must be at least 1, got 0"):
        Reflector(source, Recorder().handlers(), transform=name_of, name="t", page_size=0)
    with pytest.raises(ValueError, match="watch_timeout_seconds must be at least 1, got 0"):
        Reflector(source, Recorder().handlers(), transform=name_of, name="t", watch_timeout_seconds=0)

    class Decoded:
        def list_page(self, limit: int, continue_token: str | None) -> Any:
            return {}

        def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
            return iter(())

    with pytest.raises(ValueError, match="needs a source that serves raw pages"):
        Reflector(Decoded(), Recorder().handlers(), transform=name_of, name="t", prefilter=lambda raw: True)


@dataclass(frozen=True)
class CountingBackoff(Backoff):
    """Records the attempt number of every wait the reflector asks for, and waits only briefly."""

    attempts: list[int] = field(default_factory=list, compare=False)

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return 0.02


class Scripted:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Unsteady:
    """A source that fails its first three lists, then lists; its first watch runs well for a while
    (past the backoff's calm spell, on the clock the test moves) and is then cut (a connection reset)
    or ended by the server, and every later watch fails at once."""

    def __init__(self, healthy_s: float, first_watch: str, clock: Scripted, calm_s: float) -> None:
        self.healthy_s = healthy_s
        self.first_watch = first_watch
        self.clock = clock
        self.calm_s = calm_s
        self.lists = 0
        self.watches = 0

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        self.lists += 1
        if self.lists <= 3:
            raise ApiUnavailable("API server unreachable: connection refused")
        return {"items": [], "metadata": {"resourceVersion": "5"}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        self.watches += 1
        if self.watches == 1:
            time.sleep(self.healthy_s)
            self.clock.now += self.calm_s
            if self.first_watch == "ends":
                return iter(())
        raise ApiUnavailable("API server unreachable: connection reset by peer")


@pytest.mark.parametrize("first_watch", ["cut", "ends"])
def test_retries_back_off_further_each_time_and_afresh_after_a_healthy_watch(first_watch: str) -> None:
    clock = Scripted()
    backoff = CountingBackoff(reset_after=120.0, clock=clock)
    recorder = Recorder()
    # Longer than a failing stream runs, and (on the backoff's clock) longer than its calm spell.
    source = Unsteady(healthy_s=1.1, first_watch=first_watch, clock=clock, calm_s=120.5)
    running = Running(reflector(source, recorder, backoff=backoff))
    recorder.wait(lambda: len(backoff.attempts) >= 6, "three failed lists, the cut watch, two more")
    running.stop()
    assert source.lists == 4 and len(recorder.lists) == 1  # the watch resumes: no relist
    # Each failed list waits longer than the one before; the failures before the list do not count
    # against a watch that ran well past the calm spell, so the failure after it waits the first wait
    # again, then longer.
    assert backoff.attempts[:6] == [0, 1, 2, 0, 1, 2]


class GoneOnWatch:
    """A source whose first watch is refused with an HTTP 410 (not a 410 ERROR event), then silent."""

    def __init__(self) -> None:
        self.lists = 0
        self.watches = 0
        self.released = threading.Event()

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        self.lists += 1
        items = [pod("kept")] if self.lists == 1 else [pod("relisted")]
        return {"items": items, "metadata": {"resourceVersion": str(self.lists)}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        self.watches += 1
        if self.watches == 1:
            raise ApiError(410, "Expired", "too old resource version: 1 (5)")
        self.released.wait(10)
        return iter(())


def test_a_watch_refused_with_http_410_relists_without_counting_a_failure() -> None:
    source = GoneOnWatch()
    recorder = Recorder()
    running = Running(reflector(source, recorder))
    recorder.wait(lambda: len(recorder.lists) == 2, "the relist after the 410")
    source.released.set()
    running.stop()
    assert [name for _, name in recorder.lists[1].items] == ["relisted"]
    assert running.reflector.relists_gone == 1 and recorder.failures == []


class AlwaysGone:
    """A source with no history: every watch is refused at once, by an HTTP 410 or a 410 ERROR event."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.lists = 0

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        self.lists += 1
        return {"items": [], "metadata": {"resourceVersion": str(self.lists)}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        if self.how == "http":
            raise ApiError(410, "Expired", f"too old resource version: {resource_version}")
        status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
        return iter([{"type": "ERROR", "object": status}])


@pytest.mark.parametrize("how", ["http", "event"])
def test_a_server_that_refuses_every_watch_with_410_is_relisted_after_growing_waits(how: str) -> None:
    backoff = CountingBackoff()
    recorder = Recorder()
    source = AlwaysGone(how)
    running = Running(reflector(source, recorder, backoff=backoff))
    recorder.wait(lambda: len(recorder.lists) >= 5, "five lists")
    running.stop()
    # The first relist (after the calm start) is at once; every later one waited, longer each time:
    # the server is not hammered.
    assert backoff.attempts[:3] == [0, 1, 2]
    assert len(backoff.attempts) >= len(recorder.lists) - 2 and recorder.failures == []


def until(condition: Callable[[], bool], what: str, limit_s: float = HANG_S) -> None:
    """Poll for a condition no handler reports (the waits a backoff was asked for)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


class BookmarkThenGone:
    """A flapping server: every watch opens, sends one bookmark, and is ended at once with a 410 ERROR
    event (or is cut). A stream that carried something is not a calm one: the relists must back off."""

    def __init__(self, end: str) -> None:
        self.end = end
        self.lists = 0

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        self.lists += 1
        return {"items": [], "metadata": {"resourceVersion": str(self.lists)}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": resource_version + "0"}}}
        if self.end == "cut":
            raise ApiUnavailable("API server unreachable: connection reset by peer")
        yield {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}


@pytest.mark.parametrize("end", ["gone", "cut"])
def test_a_watch_that_dies_right_after_one_event_is_retried_after_growing_waits(end: str) -> None:
    backoff = CountingBackoff()
    recorder = Recorder()
    source = BookmarkThenGone(end)
    running = Running(reflector(source, recorder, backoff=backoff))
    until(lambda: len(backoff.attempts) >= 4, "four waits")
    running.stop()
    assert backoff.attempts[:4] == [0, 1, 2, 3]


class ShortLived:
    """A flapping server whose every watch runs a little over the short-watch second, then is cut or
    ended with a 410 ERROR event: it is no healthy server, and must not be retried at the first wait."""

    def __init__(self, end: str) -> None:
        self.end = end

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        return {"items": [], "metadata": {"resourceVersion": "7"}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        time.sleep(1.05)
        if self.end == "cut":
            raise ApiUnavailable("API server unreachable: connection reset by peer")
        return iter([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}])


@pytest.mark.parametrize("end", ["gone", "cut"])
def test_a_server_that_cuts_every_watch_after_a_second_is_retried_after_growing_waits(end: str) -> None:
    backoff = CountingBackoff()
    recorder = Recorder()
    running = Running(reflector(ShortLived(end), recorder, backoff=backoff))
    until(lambda: len(backoff.attempts) >= 3, "three waits")
    running.stop()
    # client-go's reflector restarts its backoff only after two minutes without one, not after a watch
    # that outlived the one-second "very short watch" test.
    assert backoff.attempts[:3] == [0, 1, 2]


class ExpiringContinue:
    """A server whose continue tokens have always expired: every second page is refused with 410."""

    def __init__(self) -> None:
        self.first_pages = 0

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        if continue_token is not None:
            raise ApiError(410, "Expired", "The provided continue parameter is too old")
        self.first_pages += 1
        return {"items": [pod("p")], "metadata": {"resourceVersion": "3", "continue": "next"}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        raise AssertionError("never listed, never watched")


def test_continue_tokens_that_always_expire_restart_the_list_after_growing_waits() -> None:
    backoff = CountingBackoff()
    recorder = Recorder()
    source = ExpiringContinue()
    running = Running(reflector(source, recorder, backoff=backoff))
    until(lambda: len(backoff.attempts) >= 3, "three waits")
    running.stop()
    # The first expiry restarts at once (as client-go's pager retries at once); the next ones wait.
    assert backoff.attempts[:3] == [0, 1, 2] and recorder.lists == []
    assert running.reflector.expired_continues - len(backoff.attempts) in (0, 1)
    # Every restart reads the first page again.
    assert source.first_pages - running.reflector.expired_continues in (0, 1)


class SameToken:
    """A server that answers a continue token with a page that names the same token again."""

    def __init__(self) -> None:
        self.pages = 0

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        self.pages += 1
        return {"items": [pod(f"p{self.pages}")], "metadata": {"resourceVersion": "3", "continue": "again"}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        raise AssertionError("never listed, never watched")


def test_a_continue_token_answered_with_itself_fails_the_list_with_a_reason() -> None:
    recorder = Recorder()
    source = SameToken()
    running = Running(reflector(source, recorder))
    recorder.wait(lambda: bool(recorder.failures), "the list refused")
    running.stop()
    assert "sent back the continue token it was given ('again')" in str(recorder.failures[0])
    assert recorder.lists == []


class FailingAfter:
    """Every watch fails at once, after moving the backoff's clock by the next scripted amount."""

    def __init__(self, clock: Scripted, quiet: list[float]) -> None:
        self.clock = clock
        self.quiet = quiet

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        return {"items": [], "metadata": {"resourceVersion": "7"}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        self.clock.now += self.quiet.pop(0) if self.quiet else 0.0
        raise ApiUnavailable("API server unreachable: connection refused")


def test_the_backoff_restarts_after_reset_after_seconds_without_a_wait_and_not_before() -> None:
    clock = Scripted()
    backoff = CountingBackoff(reset_after=120.0, clock=clock)
    recorder = Recorder()
    running = Running(
        reflector(FailingAfter(clock, [0.0, 0.0, 120.0, 120.001, 0.0]), recorder, backoff=backoff)
    )
    until(lambda: len(backoff.attempts) >= 5, "five waits")
    running.stop()
    # 120 s without a wait is not yet calm; just past it is, and the count starts again.
    assert backoff.attempts[:5] == [0, 1, 2, 0, 1]


# -- lists from the API server's watch cache (client-go's relistResourceVersion) -----------------------


def compact_during_an_outage(apiserver: ApiServerStandin, created: dict[str, Any]) -> None:
    """Cut the watch, create `created` and compact past it: the watch's resume is refused with 410."""
    apiserver.set_outage(True)
    apiserver.put(created)
    apiserver.expire_history()
    apiserver.set_outage(False)


def list_queries(apiserver: ApiServerStandin) -> list[dict[str, str]]:
    return [r.query for r in apiserver.requests("GET", "/api/v1/pods") if r.query.get("watch") is None]


def test_without_list_from_cache_every_list_is_a_consistent_read(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    apiserver.put(pod("p0"))
    recorder = Recorder()
    running = Running(reflector(KubeSource(kube, "pod"), recorder))
    recorder.wait(lambda: bool(recorder.lists), "the first list")
    compact_during_an_outage(apiserver, pod("p1"))
    recorder.wait(lambda: len(recorder.lists) == 2, "the relist after 410")
    running.stop()
    assert [q.get("resourceVersion") for q in list_queries(apiserver)] == [None, None]


def test_from_the_cache_the_first_list_asks_for_0_and_a_relist_for_the_last_version_seen(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    for index in range(3):
        apiserver.put(pod(f"p{index}"))
    recorder = Recorder()
    running = Running(reflector(KubeSource(kube, "pod"), recorder, page_size=2, list_from_cache=True))
    recorder.wait(lambda: bool(recorder.lists), "the first list")
    apiserver.put(pod("late"))
    recorder.wait(lambda: bool(recorder.events), "the watch event")
    seen = recorder.events[-1].resource_version
    compact_during_an_outage(apiserver, pod("later"))
    recorder.wait(lambda: len(recorder.lists) == 2, "the relist after 410")
    running.stop()
    first, second, relist = list_queries(apiserver)
    # "0" pages as asked (a watch cache before Kubernetes 1.33 answers it whole); its later pages
    # follow the token alone.
    assert (first.get("resourceVersion"), first.get("limit")) == ("0", "2")
    assert "resourceVersion" not in second and second.get("continue")
    # Unpaged, so that the watch cache answers it, and never older than the last event.
    assert relist == {"resourceVersion": seen, "resourceVersionMatch": "NotOlderThan"}
    assert [name for _, name in recorder.lists[1].items] == ["late", "later", "p0", "p1", "p2"]


class TooNew:
    """A source that refuses a list at any version but "0" as one the server has not reached."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []  # (version, limit); "" for a plain list_page
        self.released = threading.Event()

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        self.calls.append(("", limit))
        return {"items": [pod("consistent")], "metadata": {"resourceVersion": "5"}}

    def list_page_at(self, limit: int | None, resource_version: str) -> Any:
        self.calls.append((resource_version, limit))
        if resource_version != "0":
            message = f"Timeout: Too large resource version: {resource_version}, current: 5"
            raise ApiError(504, "Timeout", message)
        return {"items": [pod("cached")], "metadata": {"resourceVersion": "9"}}

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        if len(self.calls) == 1:  # the first watch ends with 410: relist at the version seen
            return iter([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}])
        self.released.wait(10)
        return iter(())


def test_a_relist_at_a_version_the_server_has_not_reached_is_made_again_at_once_consistently() -> None:
    source = TooNew()
    recorder = Recorder()
    # Any wait would outlast the test: the consistent list must come at once, as client-go makes it.
    backoff = Backoff(initial=3600, maximum=3600)
    running = Running(reflector(source, recorder, backoff=backoff, page_size=7, list_from_cache=True))
    recorder.wait(lambda: len(recorder.lists) == 2, "the consistent relist")
    source.released.set()
    running.stop()
    assert source.calls == [("0", 7), ("9", None), ("", 7)]
    assert [name for _, name in recorder.lists[1].items] == ["consistent"]
    assert recorder.failures == []


def test_a_reflector_from_the_cache_needs_a_source_naming_versions_and_no_prefilter(kube: Kube) -> None:
    class Unversioned:
        def list_page(self, limit: int, continue_token: str | None) -> Any:
            return {}

        def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
            return iter(())

    with pytest.raises(ValueError, match="needs a source that names versions"):
        Reflector(Unversioned(), Recorder().handlers(), transform=name_of, name="t", list_from_cache=True)
    with pytest.raises(ValueError, match="a reflector with a prefilter lists consistently, in pages"):
        Reflector(
            KubeSource(kube, "pod"),
            Recorder().handlers(),
            transform=name_of,
            name="t",
            prefilter=lambda raw: True,
            list_from_cache=True,
        )
    Reflector(
        KubeSource(kube, "pod"), Recorder().handlers(), transform=name_of, name="t", list_from_cache=True
    )
