"""Dynamic-MIG planning: where each slot of a Volcano MIG group lives on a GPU, and what to change.

Pure: NVML facts and pod holdings in, plans and decisions out. The plan is what makes the
scheduler's `[<group>-<position>]` robust: every position of a group gets a fixed GPU instance
profile and an explicit memory placement, computed deterministically from the group (template
order) and the GPU's own profile table. Position -> instance is then found by (profile, placement)
in NVML's state, never by the MIG device index (Volcano's reference plugin assumes "index = position"
unchecked), and the same mapping is rebuilt from NVML alone after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kube_vgpu.contract.mig.geometry import MigGroup


class LayoutError(ValueError):
    """A group that cannot be laid out on a GPU (unknown profile, placements that do not fit)."""


@dataclass(frozen=True)
class ProfileSpec:
    """One GPU instance profile as NVML describes it on a GPU (`nvmlDeviceGetGpuInstanceProfileInfo`)."""

    name: str  # without NVML's "MIG " prefix, e.g. "2g.10gb"
    profile_id: int
    slice_count: int  # compute slices
    memory_mib: int
    instance_count: int
    starts: tuple[int, ...]  # possible placements, in memory slices
    placement_size: int  # memory slices one instance covers


@dataclass(frozen=True)
class PlannedInstance:
    """Where position `position` of a group lives: a profile at an explicit placement."""

    position: int
    type_name: str
    profile_id: int
    start: int
    size: int
    memory_mib: int  # the profile's memory (NVML's), not the geometry's

    @property
    def slices(self) -> range:
        """The memory slices the instance covers."""
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class LayoutPlan:
    """A group laid out on one GPU model: one planned instance per position, in position order."""

    group: str
    instances: tuple[PlannedInstance, ...]

    def at(self, position: int) -> PlannedInstance:
        """The planned instance of `position` (positions are 0..len-1)."""
        return self.instances[position]


@dataclass(frozen=True)
class ObservedCompute:
    """A compute instance NVML reports, with its MIG device."""

    ci_id: int
    mig_uuid: str
    memory_mib: int
    full: bool  # spans the whole GPU instance (the only shape the plugin creates or hands out)


@dataclass(frozen=True)
class ObservedInstance:
    """A GPU instance NVML reports, with its compute instances."""

    gi_id: int
    profile_id: int
    start: int
    size: int
    compute: tuple[ObservedCompute, ...] = ()

    @property
    def slices(self) -> range:
        """The memory slices the instance covers."""
        return range(self.start, self.start + self.size)

    def matches(self, planned: PlannedInstance) -> bool:
        """Same profile at the same placement, and not split into several compute instances."""
        return (
            self.profile_id == planned.profile_id
            and self.start == planned.start
            and (not self.compute or (len(self.compute) == 1 and self.compute[0].full))
        )


# ---------------------------------------------------------------------------------------------
# Planning a group on a GPU


def _total_compute_slices(profiles: Iterable[ProfileSpec]) -> int:
    # The largest profile (7g) spans every compute slice of the GPU.
    return max((p.slice_count for p in profiles), default=0)


def plan_group(group: MigGroup, profiles: Mapping[str, ProfileSpec]) -> LayoutPlan:
    """Lay `group` out on a GPU whose profiles are `profiles` (by name), or raise LayoutError.

    Positions are placed in template order, each at the lowest placement start that leaves the
    later positions room (a small backtracking search: at most 7 instances of at most 8 starts), so
    the same group always gets the same placements on the same model.
    """
    wanted: list[ProfileSpec] = []
    for instance_type in group.instance_types:
        profile = profiles.get(instance_type.name)
        if profile is None:
            have = ", ".join(sorted(profiles)) or "none"
            raise LayoutError(
                f"group {group.name!r}: this GPU has no MIG profile {instance_type.name!r} (it has {have})"
            )
        if instance_type.count > profile.instance_count:
            raise LayoutError(
                f"group {group.name!r}: {instance_type.count} x {instance_type.name} asked, the GPU "
                f"holds at most {profile.instance_count}"
            )
        wanted.extend([profile] * instance_type.count)
    compute_total = _total_compute_slices(profiles.values())
    if sum(p.slice_count for p in wanted) > compute_total:
        raise LayoutError(
            f"group {group.name!r} needs {sum(p.slice_count for p in wanted)} compute slices, "
            f"the GPU has {compute_total}"
        )
    starts = _place(wanted, 0, set())
    if starts is None:
        raise LayoutError(f"group {group.name!r}: no placement of its instances fits the GPU's memory slices")
    return LayoutPlan(
        group=group.name,
        instances=tuple(
            PlannedInstance(
                position=i,
                type_name=p.name,
                profile_id=p.profile_id,
                start=s,
                size=p.placement_size,
                memory_mib=p.memory_mib,
            )
            for i, (p, s) in enumerate(zip(wanted, starts, strict=True))
        ),
    )


def _place(wanted: Sequence[ProfileSpec], i: int, used: set[int]) -> list[int] | None:
    if i == len(wanted):
        return []
    profile = wanted[i]
    for start in sorted(profile.starts):
        covered = set(range(start, start + profile.placement_size))
        if covered & used:
            continue
        rest = _place(wanted, i + 1, used | covered)
        if rest is not None:
            return [start, *rest]
    return None


def plan_groups(groups: Iterable[MigGroup], profiles: Mapping[str, ProfileSpec]) -> dict[str, LayoutPlan]:
    """The plan of every group that can be laid out on the GPU (the others are left out)."""
    plans: dict[str, LayoutPlan] = {}
    for group in groups:
        try:
            plans[group.name] = plan_group(group, profiles)
        except LayoutError:
            continue
    return plans


# ---------------------------------------------------------------------------------------------
# Reading NVML state against a plan


def find_planned(
    plan: LayoutPlan, position: int, observed: Iterable[ObservedInstance]
) -> ObservedInstance | None:
    """The existing instance that is `position` of `plan`, if there is one."""
    planned = plan.at(position)
    return next((o for o in observed if o.matches(planned)), None)


def fits_plan(plan: LayoutPlan, observed: Iterable[ObservedInstance]) -> bool:
    """Whether every existing instance is one of the plan's (the GPU holds part or all of the layout)."""
    return all(any(o.matches(p) for p in plan.instances) for o in observed)


def matching_groups(plans: Mapping[str, LayoutPlan], observed: Sequence[ObservedInstance]) -> list[str]:
    """The groups whose layout the GPU's instances are (part of); empty for an empty GPU."""
    if not observed:
        return []
    return [name for name, plan in plans.items() if fits_plan(plan, observed)]


# ---------------------------------------------------------------------------------------------
# Deciding what an Allocate changes


@dataclass(frozen=True)
class SlotHolder:
    """Someone else who holds a MIG slot on the same GPU: for messages and for conflicts."""

    owner: str  # e.g. "pod default/a"
    group: str
    position: int


@dataclass(frozen=True)
class LayoutActions:
    """NVML changes that make a slot exist: destroy (GI ids, with their compute instances) first,
    then create planned instances, then give compute-less GPU instances their compute instance."""

    destroy: tuple[int, ...] = ()
    create: tuple[PlannedInstance, ...] = ()
    add_compute: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to change: the slot exists."""
        return not (self.destroy or self.create or self.add_compute)


@dataclass(frozen=True)
class Refusal:
    """Why the slot cannot be made to exist without hurting a live pod."""

    reason: str


def _owners(holders: Iterable[SlotHolder]) -> str:
    return ", ".join(sorted({h.owner for h in holders}))


def decide_layout(
    plan: LayoutPlan,
    position: int,
    observed: Sequence[ObservedInstance],
    others: Sequence[SlotHolder],
) -> LayoutActions | Refusal:
    """What to change on a GPU so that `position` of `plan.group` exists, given what NVML shows and
    the slots other live containers already hold on this GPU.

    - Another group held here: refused; a different layout would destroy a live instance
      (Volcano may pick another group for a GPU already partitioned).
    - The same slot held by another container: refused; a MIG instance is not shared.
    - Nothing held: the GPU is (re)made into exactly the group's layout, destroying whatever
      else is there.
    - The same group held: only missing instances of the plan are created, and only where no
      foreign instance is in the way; nothing is destroyed.
    """
    if not 0 <= position < len(plan.instances):
        return Refusal(
            f"position {position} is outside group {plan.group!r}, whose positions are "
            f"0..{len(plan.instances) - 1}"
        )
    foreign_groups = [h for h in others if h.group != plan.group]
    if foreign_groups:
        groups = ", ".join(sorted({h.group for h in foreign_groups}))
        return Refusal(
            f"the GPU is partitioned as {groups} for live {_owners(foreign_groups)}; "
            f"[{plan.group}-{position}] needs layout {plan.group}, which would destroy their instances"
        )
    same_slot = [h for h in others if h.position == position]
    if same_slot:
        return Refusal(
            f"MIG slot [{plan.group}-{position}] is already held by {_owners(same_slot)}; a MIG instance "
            "is not shared (the scheduler gave one slot twice in one session)"
        )
    missing = [p for p in plan.instances if not any(o.matches(p) for o in observed)]
    unfinished = tuple(
        o.gi_id for o in observed if not o.compute and any(o.matches(p) for p in plan.instances)
    )
    foreign = [o for o in observed if not any(o.matches(p) for p in plan.instances)]
    if not others:
        if foreign:
            return LayoutActions(destroy=tuple(o.gi_id for o in observed), create=plan.instances)
        return LayoutActions(create=tuple(missing), add_compute=unfinished)
    # Live slots of this group exist: add what is missing, never remove anything.
    blocked = {s for o in foreign for s in o.slices}
    creatable = tuple(p for p in missing if blocked.isdisjoint(p.slices))
    wanted = plan.at(position)
    if wanted in missing and wanted not in creatable:
        return Refusal(
            f"instance {wanted.type_name} at placement {wanted.start}:{wanted.size} for "
            f"[{plan.group}-{position}] is blocked by GPU instance(s) "
            f"{', '.join(str(o.gi_id) for o in foreign)} outside the layout, and live "
            f"{_owners(others)} hold slots here"
        )
    return LayoutActions(create=creatable, add_compute=unfinished)


# ---------------------------------------------------------------------------------------------
# Reconciling idle GPUs


def teardown_due(
    candidates: Iterable[str], idle_since: Mapping[str, float], now: float, grace_seconds: float
) -> tuple[list[str], dict[str, float]]:
    """Which idle GPUs' layouts to destroy now, and the idle clocks to keep.

    `candidates` are the GPUs that hold instances no live pod holds or awaits; a GPU is due once it
    has been such a candidate for `grace_seconds` in a row (its clock starts the first time it is
    seen idle, so after a restart the grace is counted again in full). A GPU that is not a
    candidate loses its clock.
    """
    clocks = {uuid: idle_since.get(uuid, now) for uuid in candidates}
    due = sorted(uuid for uuid, since in clocks.items() if now - since >= grace_seconds)
    return due, {uuid: since for uuid, since in clocks.items() if uuid not in due}
