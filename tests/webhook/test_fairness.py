"""`webhook.fairness`: large reviews take turns round the namespaces; small ones never wait."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from kube_vgpu.webhook.fairness import FairTurns, namespace_of
from tests.support.webhook import container, pod, review


async def _answered(turns: FairTurns, body: bytes, answer: Callable[[], str]) -> str:
    """The answer to one review, once its turn has come (at once for a small body)."""
    result = turns.run(body, answer)
    return await result if isinstance(result, Awaitable) else result


def _body(namespace: str, size: int) -> bytes:
    """A review body from `namespace` of at least `size` bytes (padded inside an annotation)."""
    obj = pod(container(memory=1024), namespace=namespace)
    obj["metadata"]["annotations"] = {"pad": "x" * size}
    return json.dumps(review(obj), separators=(",", ":")).encode()


def test_the_namespace_is_read_from_the_request_before_the_object() -> None:
    body = _body("team-b", 10)
    assert body.index(b'"namespace":"team-b"') < body.index(b'"object"')
    assert namespace_of(body) == "team-b"
    assert (
        namespace_of(b'{"request": {"namespace" : "x-1", "object": {"metadata": {"namespace": "y"}}}}')
        == "x-1"
    )
    assert namespace_of(b'{"request": {"uid": "u"}}') == ""
    assert namespace_of(b"\xff\xfe garbage") == ""


def test_a_small_review_is_answered_at_once_without_a_turn() -> None:
    turns = FairTurns(large_bytes=1000)
    assert turns.run(b"x" * 1000, lambda: "answer") == "answer"  # at the limit: still small


async def test_a_large_review_waits_for_its_turn() -> None:
    turns = FairTurns(large_bytes=1000)
    ran: list[str] = []

    def large() -> str:
        ran.append("large")
        return "answer"

    pending = turns.run(_body("a", 1001), large)
    assert isinstance(pending, Awaitable) and ran == []
    assert await pending == "answer" and ran == ["large"]


async def test_turns_go_round_the_namespaces() -> None:
    # Ten large reviews of namespace a are waiting when two of b and one of c arrive: b and c wait
    # for one review of each other namespace per round, not for all of a's.
    turns = FairTurns(large_bytes=100)
    order: list[str] = []

    def answer(name: str) -> str:
        order.append(name)
        return name

    names = [f"a{i}" for i in range(10)] + ["b0", "b1", "c0"]
    pending = [_answered(turns, _body(name[0], 200), lambda name=name: answer(name)) for name in names]  # type: ignore[misc]
    assert turns.waiting == 0  # nothing waits until the loop runs the coroutines
    results = await asyncio.gather(*pending)
    assert results == names
    assert order[:6] == ["a0", "b0", "c0", "a1", "b1", "a2"]
    assert order[6:] == [f"a{i}" for i in range(3, 10)]


async def test_the_loop_serves_other_work_between_two_large_reviews() -> None:
    # One turn per pass of the loop: a small review (or any I/O callback) arriving meanwhile runs
    # before the next large one, however many are waiting.
    turns = FairTurns(large_bytes=100)
    order: list[str] = []
    loop = asyncio.get_running_loop()

    def large(i: int) -> str:
        order.append(f"large{i}")
        return ""

    waiting = [
        asyncio.ensure_future(_answered(turns, _body("a", 200), lambda i=i: large(i)))  # type: ignore[misc]
        for i in range(3)
    ]
    await asyncio.sleep(0)  # all three are waiting now
    assert turns.waiting == 3
    loop.call_soon(lambda: order.append("small"))
    await asyncio.gather(*waiting)
    assert order.index("small") <= 1


async def test_a_waiter_that_went_away_is_skipped() -> None:
    turns = FairTurns(large_bytes=100)
    ran: list[str] = []

    def mark(name: str) -> str:
        ran.append(name)
        return name

    gone = asyncio.ensure_future(_answered(turns, _body("a", 200), lambda: mark("gone")))
    kept = asyncio.ensure_future(_answered(turns, _body("b", 200), lambda: mark("kept")))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(kept, gone, return_exceptions=True)
    assert ran == ["kept"] and turns.waiting == 0


async def test_an_awaitable_answer_is_awaited_after_the_turn() -> None:
    turns = FairTurns(large_bytes=10)

    async def later() -> str:
        await asyncio.sleep(0)
        return "validated"

    result: object = turns.run(_body("a", 20), later)
    assert isinstance(result, Awaitable)
    assert await result == "validated"


async def test_the_arguments_reach_the_answer_with_or_without_a_turn() -> None:
    turns = FairTurns(large_bytes=1000)

    def answer(word: str, count: int) -> str:
        return word * count

    assert turns.run(b"x" * 10, answer, "ab", 2) == "abab"
    pending = turns.run(_body("a", 1001), answer, "cd", 3)
    assert isinstance(pending, Awaitable)
    assert await pending == "cdcdcd"


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        FairTurns(large_bytes=-1)
