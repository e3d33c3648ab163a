"""The stand-in API server's lists and watches, driven only through the official Kubernetes client:
order, selectors, pagination, resourceVersion resume, 410 Gone, bookmarks, closed streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.official_client import body, raw, status_of


@pytest.fixture
def core(apiserver: ApiServerStandin) -> Iterator[client.CoreV1Api]:
    with apiserver.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def pod(
    name: str,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    node: str | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": phase},
    }


def names(items: list[Any]) -> list[str]:
    return [item.metadata.name for item in items]


def collect(stream: Iterator[dict[str, Any]], count: int, w: watch.Watch) -> list[tuple[str, str]]:
    """The first `count` events of a stream (streams are opened with a timeout, so a missing event
    fails the test at once instead of waiting forever)."""
    events: list[tuple[str, str]] = []
    for event in stream:
        events.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if len(events) == count:
            w.stop()
    return events


# -- lists ----------------------------------------------------------------------------------------------


def test_list_is_in_namespace_then_name_order_with_resource_version(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    for namespace in ("b", "a"):
        apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for namespace, name in (("b", "x"), ("a", "z"), ("a", "y")):
        apiserver.put(pod(name, namespace))
    listed = core.list_pod_for_all_namespaces()
    assert [(p.metadata.namespace, p.metadata.name) for p in listed.items] == [
        ("a", "y"),
        ("a", "z"),
        ("b", "x"),
    ]
    assert listed.metadata.resource_version == str(apiserver.store.rv)
    assert names(core.list_namespaced_pod("a").items) == ["y", "z"]


def test_raw_list_items_carry_no_kind(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(pod("p"))
    listed = json.loads(raw(core.list_namespaced_pod("default", _preload_content=False)).data)
    assert (listed["kind"], listed["apiVersion"]) == ("PodList", "v1")
    assert "kind" not in listed["items"][0] and listed["items"][0]["metadata"]["name"] == "p"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
        ("app in (web, db)", ["a", "b", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("app=web,tier=front", ["a"]),
        ("app in (db),!tier", []),
    ],
)
def test_label_selectors(
    apiserver: ApiServerStandin, core: client.CoreV1Api, selector: str, expected: list[str]
) -> None:
    apiserver.put(pod("a", labels={"app": "web", "tier": "front"}))
    apiserver.put(pod("b", labels={"app": "web"}))
    apiserver.put(pod("c", labels={"app": "db", "tier": "back"}))
    apiserver.put(pod("d"))
    assert names(core.list_namespaced_pod("default", label_selector=selector).items) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", ["a", "b"]),
        ("spec.nodeName==n2", ["c"]),
        ("spec.nodeName=", ["d"]),
        ("spec.nodeName!=n1", ["c", "d"]),
        ("status.phase=Running", ["a", "c"]),
        ("status.phase!=Succeeded,status.phase!=Failed,spec.nodeName=n1", ["a"]),
        ("metadata.name=b", ["b"]),
        ("metadata.namespace=default", ["a", "b", "c", "d"]),
    ],
)
def test_field_selectors(
    apiserver: ApiServerStandin, core: client.CoreV1Api, selector: str, expected: list[str]
) -> None:
    apiserver.put(pod("a", node="n1", phase="Running"))
    apiserver.put(pod("b", node="n1", phase="Succeeded"))
    apiserver.put(pod("c", node="n2", phase="Running"))
    apiserver.put(pod("d"))
    assert names(core.list_pod_for_all_namespaces(field_selector=selector).items) == expected


def test_bad_selectors_are_400(core: client.CoreV1Api) -> None:
    with pytest.raises(client.ApiException) as caught:
        core.list_namespaced_pod("default", field_selector="spec.hostname=x")
    assert caught.value.status == 400
    assert "field label not supported: spec.hostname" in status_of(caught.value)["message"]
    with pytest.raises(client.ApiException) as caught:
        core.list_namespaced_pod("default", label_selector="app in web")
    assert caught.value.status == 400 and status_of(caught.value)["reason"] == "BadRequest"


def test_pagination_is_consistent_across_pages(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    for index in range(5):
        apiserver.put(pod(f"p{index}"))
    first = core.list_namespaced_pod("default", limit=2)
    assert names(first.items) == ["p0", "p1"] and first.metadata.remaining_item_count == 3
    # Changes after the first page do not show in later pages: they read the first page's revision.
    apiserver.put(pod("p15"))
    apiserver.delete("pods", "p3")
    second = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)  # noqa: SLF001 (the kubernetes client names the continue token so)
    third = core.list_namespaced_pod("default", limit=2, _continue=second.metadata._continue)  # noqa: SLF001 (the kubernetes client names the continue token so)
    assert names(second.items) == ["p2", "p3"] and names(third.items) == ["p4"]
    assert third.metadata._continue is None  # noqa: SLF001 (the kubernetes client names the continue token so)
    assert second.metadata.resource_version == first.metadata.resource_version


def test_continue_token_older_than_the_history_is_410(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    # kube-apiserver's storage answers a compacted continue token with 410 Expired, the message of
    # staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go (`inconsistentContinue`), and a new
    # continue token at resourceVersion -1 (`handleCompactedErrorForPaging`) that serves the rest of
    # the list at the latest revision, changes made meanwhile included.
    for index in range(3):
        apiserver.put(pod(f"p{index}"))
    first = core.list_namespaced_pod("default", limit=1)
    apiserver.put(pod("p9"))
    apiserver.expire_history()
    with pytest.raises(client.ApiException) as caught:
        core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)  # noqa: SLF001 (the kubernetes client names the continue token so)
    status = status_of(caught.value)
    assert caught.value.status == 410 and status["reason"] == "Expired" and status["code"] == 410
    assert status["message"] == (
        "The provided continue parameter is too old to display a consistent list result. You can start "
        "a new list without the continue parameter, or use the continue token in this response to "
        "retrieve the remainder of the results. Continuing with the provided token results in an "
        "inconsistent list - objects that were created, modified, or deleted between the time the first "
        "chunk was returned and now may show up in the list."
    )
    rest = core.list_namespaced_pod("default", limit=10, _continue=status["metadata"]["continue"])
    assert names(rest.items) == ["p1", "p2", "p9"] and rest.metadata._continue is None  # noqa: SLF001 (the kubernetes client names the continue token so)
    assert rest.metadata.resource_version == str(apiserver.store.rv)


def test_a_page_at_the_limit_and_one_past_it(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    for index in range(3):
        apiserver.put(pod(f"p{index}"))
    whole = core.list_namespaced_pod("default", limit=3)
    assert names(whole.items) == ["p0", "p1", "p2"] and whole.metadata._continue is None  # noqa: SLF001 (the kubernetes client names the continue token so)
    assert whole.metadata.remaining_item_count is None
    short = core.list_namespaced_pod("default", limit=2)
    assert names(short.items) == ["p0", "p1"] and short.metadata._continue  # noqa: SLF001 (the kubernetes client names the continue token so)
    assert short.metadata.remaining_item_count == 1


def test_a_filtered_page_has_no_remaining_item_count(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    # kube-apiserver's storage (etcd3 store.go) counts the rest of the key range, matching or not, so
    # it leaves remainingItemCount out whenever a selector filters the list; the continue stays.
    for index in range(4):
        apiserver.put(pod(f"p{index}", node="n1" if index % 2 else "n2"))
    mine = core.list_namespaced_pod("default", limit=1, field_selector="spec.nodeName=n1")
    assert names(mine.items) == ["p1"] and mine.metadata._continue  # noqa: SLF001 (the kubernetes client names the continue token so)
    assert mine.metadata.remaining_item_count is None
    unfiltered = core.list_namespaced_pod("default", limit=1)
    assert unfiltered.metadata.remaining_item_count == 3


def test_compact_objects_are_served_like_any_other(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    bare = []
    for index in range(3):
        stored = pod(f"c{index}")
        del stored["apiVersion"], stored["kind"]
        stored["metadata"]["uid"] = f"u{index}"
        bare.append(stored)
    assert apiserver.load_compact("Pod", bare) == 3
    listed = core.list_namespaced_pod("default", limit=2)
    assert names(listed.items) == ["c0", "c1"] and listed.metadata.remaining_item_count == 1
    assert listed.items[0].metadata.resource_version == str(apiserver.store.rv - 2)
    assert apiserver.get("Pod", "c2", "default") is not None
    apiserver.put(pod("c1"))  # a compact object is replaced by a write like any other
    assert names(core.list_namespaced_pod("default").items) == ["c0", "c1", "c2"]


# -- watches --------------------------------------------------------------------------------------------


def test_watch_resumes_after_a_resource_version_in_order(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    listed = core.list_namespaced_pod("default")
    apiserver.put(pod("a"))
    middle = apiserver.put(pod("b"))["metadata"]["resourceVersion"]
    apiserver.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}})
    apiserver.delete("pods", "b")
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    )
    assert collect(stream, 4, w) == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    w = watch.Watch()
    assert collect(
        w.stream(core.list_namespaced_pod, "default", resource_version=middle, timeout_seconds=10), 2, w
    ) == [
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]


def test_watch_without_resource_version_starts_with_current_objects(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("a"))
    apiserver.put(pod("b"))
    w = watch.Watch()
    events: list[tuple[str, str]] = []
    for event in w.stream(core.list_namespaced_pod, "default", timeout_seconds=10):
        events.append((event["type"], event["object"].metadata.name))
        if len(events) == 2:
            # A live change made while the stream is open arrives next.
            core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"live": "1"}}})
        if len(events) == 3:
            w.stop()
    assert events == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a")]


def test_watch_from_an_expired_resource_version_gets_410(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    old = core.list_node().metadata.resource_version
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    apiserver.expire_history()
    stream = raw(core.list_node(watch=True, resource_version=old, timeout_seconds=5, _preload_content=False))
    lines = stream.data.splitlines()
    assert stream.status == 200 and len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == (
        "Status",
        410,
        "Expired",
    )
    assert event["object"]["message"].startswith(f"too old resource version: {old} ")
    with pytest.raises(client.ApiException) as caught:
        for _ in watch.Watch().stream(core.list_node, resource_version=old, timeout_seconds=5):
            pass
    assert caught.value.status == 410
    # The current revision is still watchable.
    w = watch.Watch()
    current = core.list_node().metadata.resource_version
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})
    assert collect(w.stream(core.list_node, resource_version=current, timeout_seconds=10), 1, w) == [
        ("ADDED", "n2")
    ]


def test_watch_with_a_field_selector_sees_objects_enter_and_leave(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    start = core.list_pod_for_all_namespaces().metadata.resource_version
    apiserver.put(pod("a"))
    apiserver.patch("pods", "a", {"spec": {"nodeName": "n1"}})
    apiserver.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}})
    apiserver.put(pod("b", node="n2"))
    apiserver.patch("pods", "a", {"spec": {"nodeName": "n2"}})
    w = watch.Watch()
    stream = w.stream(
        core.list_pod_for_all_namespaces,
        field_selector="spec.nodeName=n1",
        resource_version=start,
        timeout_seconds=10,
    )
    assert collect(stream, 3, w) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


def test_closed_watches_end_their_streams(apiserver: ApiServerStandin, core: client.CoreV1Api) -> None:
    apiserver.put(pod("a"))
    seen: list[str] = []
    for event in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=10):
        seen.append(event["type"])
        apiserver.close_watches()
    assert seen == ["ADDED"]


def test_bookmarks_carry_the_current_resource_version(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("a"))
    w = watch.Watch()
    events: list[tuple[str, str]] = []
    for event in w.stream(
        core.list_namespaced_pod, "default", allow_watch_bookmarks=True, timeout_seconds=10
    ):
        rv = event["raw_object"]["metadata"]["resourceVersion"]
        events.append((event["type"], rv))
        if event["type"] == "ADDED":
            apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "elsewhere"}})
            apiserver.send_bookmarks()
        else:
            w.stop()
    assert [t for t, _ in events] == ["ADDED", "BOOKMARK"]
    assert events[1][1] == str(apiserver.store.rv)


def test_send_initial_events_ends_with_a_marked_bookmark(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("a"))
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        "default",
        allow_watch_bookmarks=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        timeout_seconds=10,
    )
    events = []
    for event in stream:
        events.append(event)
        if event["type"] == "BOOKMARK":
            w.stop()
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[1]["raw_object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_watches_see_direct_writes_and_http_writes_alike(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    start = core.list_node().metadata.resource_version
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "direct"}})
    core.create_node(body({"metadata": {"name": "http"}}))
    apiserver.patch(
        "nodes", "http", [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}], patch_type="json"
    )
    w = watch.Watch()
    events = []
    for event in w.stream(core.list_node, resource_version=start, timeout_seconds=10):
        events.append(event)
        if len(events) == 3:
            w.stop()
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "direct"),
        ("ADDED", "http"),
        ("MODIFIED", "http"),
    ]
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 3


# -- a list's resourceVersion (the API concepts page's semantics table; ValidateListOptions) ------------


def test_a_list_at_0_or_not_older_than_a_version_reads_the_latest_state(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("p0"))
    version = str(apiserver.store.rv)
    apiserver.put(pod("p1"))
    latest = str(apiserver.store.rv)
    for listed in (
        core.list_namespaced_pod("default", resource_version="0"),
        core.list_namespaced_pod("default", resource_version="0", limit=10),
        core.list_namespaced_pod("default", resource_version=version),
        core.list_namespaced_pod("default", resource_version=latest, resource_version_match="NotOlderThan"),
        core.list_namespaced_pod(
            "default", resource_version=version, resource_version_match="NotOlderThan", limit=10
        ),
    ):
        assert names(listed.items) == ["p0", "p1"] and listed.metadata.resource_version == latest


def test_a_list_exactly_at_a_version_reads_that_state(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("p0"))
    version = str(apiserver.store.rv)
    apiserver.put(pod("p1"))
    exact = core.list_namespaced_pod("default", resource_version=version, resource_version_match="Exact")
    assert names(exact.items) == ["p0"] and exact.metadata.resource_version == version
    # A version with a limit and no match is read exactly too (the legacy rule client-go's reflector
    # avoids by listing unpaged at a version other than "0").
    legacy = core.list_namespaced_pod("default", resource_version=version, limit=10)
    assert names(legacy.items) == ["p0"] and legacy.metadata.resource_version == version


def test_a_list_at_the_current_version_is_served_and_one_past_it_is_too_large(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    apiserver.put(pod("p0"))
    current = apiserver.store.rv
    at = core.list_namespaced_pod(
        "default", resource_version=str(current), resource_version_match="NotOlderThan"
    )
    assert names(at.items) == ["p0"]
    with pytest.raises(client.ApiException) as info:
        core.list_namespaced_pod(
            "default", resource_version=str(current + 1), resource_version_match="NotOlderThan"
        )
    status = status_of(info.value)
    assert (info.value.status, status["reason"]) == (504, "Timeout")
    assert status["message"] == f"Timeout: Too large resource version: {current + 1}, current: {current}"
    assert status["details"]["causes"] == [
        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
    ]


@pytest.mark.parametrize(
    ("version", "match", "says"),
    [
        (None, "NotOlderThan", "resourceVersionMatch is forbidden unless resourceVersion"),
        ("1", "Newest", 'Unsupported value: "Newest"'),
        ("0", "Exact", 'forbidden for resourceVersion "0"'),
    ],
)
def test_a_list_with_an_impossible_version_match_is_invalid(
    core: client.CoreV1Api, version: str | None, match: str, says: str
) -> None:
    with pytest.raises(client.ApiException) as info:
        core.list_namespaced_pod("default", resource_version=version, resource_version_match=match)
    status = status_of(info.value)
    assert info.value.status == 422 and status["message"].startswith(
        'ListOptions.meta.k8s.io "" is invalid: '
    )
    assert says in status["message"]


def test_a_continue_token_with_a_version_is_refused(
    apiserver: ApiServerStandin, core: client.CoreV1Api
) -> None:
    for index in range(3):
        apiserver.put(pod(f"p{index}"))
    token = core.list_namespaced_pod("default", limit=1).metadata._continue  # noqa: SLF001 (the kubernetes client names the continue token so)
    with pytest.raises(client.ApiException) as info:
        core.list_namespaced_pod(
            "default", limit=1, _continue=token, resource_version=str(apiserver.store.rv)
        )
    assert info.value.status == 400
    message = status_of(info.value)["message"]
    assert message == "specifying resource version is not allowed when using continue"
    # "0" is let through with a token, for compatibility (k8s.io/apiserver/pkg/storage/etcd3/store.go);
    # client-go's pager clears the version on its later pages all the same.
    rest = core.list_namespaced_pod("default", limit=5, _continue=token, resource_version="0")
    assert names(rest.items) == ["p1", "p2"]
