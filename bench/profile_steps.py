"""Where a review's CPU goes inside `kube-vgpu webhook`: a summary of `bench/webhook.py --profile FILE`.

Reads the py-spy speedscope file, keeps the samples of the event loop's thread (the watch threads
sleep in socket reads, which a sampler may count), and prints the share of those samples under each
step of a review, inclusive, and the functions that spend the most samples themselves. With
`--cpu-us` (the webhook's CPU microseconds per review from the same run's table) each share is also
given in microseconds per review.

    .venv/bin/python bench/webhook.py --floor-cmd none --bare none --phases mutate --concurrency 8 \\
        --rounds 1 --profile /tmp/webhook.json
    .venv/bin/python bench/profile_steps.py /tmp/webhook.json --cpu-us 283
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

# (label, the frame names whose samples count, inclusive); a sample counts once per step.
STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the handler (all below but framing)", ("AdmissionApp.handle",)),
    ("  read the body (budget, aiohttp)", ("AdmissionApp._read",)),
    ("  parse the AdmissionReview", ("parse_review",)),
    ("  decide (the phase's rules)", ("Admission.review", "Validation.review")),
    ("  answer (metrics, log, encode)", ("_encode",)),
    ("bytes in: TLS, framing, connection hooks", ("Connection.data_received",)),
    ("answer out: headers, TLS, send", ("RequestHandler.finish_response",)),
)
# A frame of the event loop's thread: every sample of it has one of these below it.
LOOP_FRAMES = ("Runner.run", "BaseEventLoop.run_until_complete")


def loop_samples(profile: dict[str, Any]) -> list[tuple[list[str], float]]:
    """(frame names from the root, weight) of each sample taken in the event loop's thread."""
    frames = profile["shared"]["frames"]
    names = [f"{frame['name']}" for frame in frames]
    samples: list[tuple[list[str], float]] = []
    for thread in profile["profiles"]:
        for stack, weight in zip(thread["samples"], thread["weights"], strict=True):
            stack_names = [names[index] for index in stack]
            if any(name in LOOP_FRAMES for name in stack_names):
                samples.append((stack_names, weight))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", type=Path, help="speedscope JSON written by bench/webhook.py --profile")
    parser.add_argument("--cpu-us", type=float, help="the webhook's CPU us/review in the profiled run")
    parser.add_argument("--top", type=int, default=25, help="functions listed by their own samples")
    args = parser.parse_args()
    try:
        profile = json.loads(args.profile.read_bytes())
        samples = loop_samples(profile)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"profile_steps: {args.profile} is not a py-spy speedscope profile: {exc}", file=sys.stderr)
        return 2
    total = sum(weight for _, weight in samples)
    if not total:
        print(f"profile_steps: {args.profile} holds no sample of the event loop's thread", file=sys.stderr)
        return 2

    def share(part: float) -> str:
        us = f"  {part / total * args.cpu_us:6.1f} us" if args.cpu_us else ""
        return f"{100 * part / total:5.1f} %{us}"

    print(f"event loop: {total:.1f} s sampled")
    for label, wanted in STEPS:
        part = sum(weight for stack, weight in samples if any(name in wanted for name in stack))
        print(f"{share(part)}  {label}")
    own: defaultdict[str, float] = defaultdict(float)
    for stack, weight in samples:
        own[stack[-1]] += weight
    print(f"\nfunctions by their own samples (top {args.top}):")
    for name, weight in sorted(own.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{share(weight)}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
