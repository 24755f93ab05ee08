"""Where engines run: one Ray placement group per engine, and which node each group should prefer.

An engine's tensor-parallel ranks must share one node (their collectives run over NVLink or shared memory),
so each engine gets its own placement group of one bundle per rank, `STRICT_PACK`. Across engines, placement
is a preference, never a constraint: `spread` asks for the node holding the fewest of the fleet's engines,
`pack` for the one holding the most that still has room, through Ray's soft target node. A soft target that
is full or gone is passed over, so a replacement for an engine lost with its node still lands on a survivor.

The pure half (bundles, the actor's share of them, the choice of node) runs without Ray and is unit-tested;
`reserve` is the half that asks Ray, and refuses with what it asked for and what the cluster has instead of
waiting for ever on a group that cannot be placed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from schemas.errors import InputError

Resources = dict[str, float]


@dataclass(frozen=True)
class EngineShape:
    """What one engine asks of Ray: its bundles (one per tensor-parallel rank) and the engine actor's own
    share of bundle 0.

    With one rank the actor runs the model itself, so it holds the bundle's GPU. With more, vLLM's Ray
    executor starts one worker per bundle, each taking that bundle's GPU, and the actor keeps only its CPUs.
    """

    bundles: tuple[Resources, ...]
    actor_cpus: float
    actor_gpus: float

    @property
    def total(self) -> Resources:
        """The whole group's resources, which one node must hold (`STRICT_PACK`)."""
        return summed(self.bundles)

    @property
    def distributed(self) -> bool:
        """Whether vLLM must run its ranks as Ray workers in the group's bundles (more than one GPU rank)."""
        return len(self.bundles) > 1


def engine_shape(tensor_parallel_size: int, gpu: bool, engine_cpus: float) -> EngineShape:
    """One bundle per tensor-parallel rank, each with one GPU on a GPU engine; the engine's CPUs in bundle 0.

    vLLM on CPU runs tensor parallel 1, so a CPU engine is one bundle of its CPUs.
    """
    if not gpu:
        return EngineShape(({"CPU": float(engine_cpus)},), float(engine_cpus), 0.0)
    first = {"CPU": float(engine_cpus), "GPU": 1.0}
    bundles = (first, *({"GPU": 1.0} for _ in range(tensor_parallel_size - 1)))
    return EngineShape(bundles, float(engine_cpus), 1.0 if tensor_parallel_size == 1 else 0.0)


def summed(bundles: Iterable[Resources]) -> Resources:
    total: Counter[str] = Counter()
    for bundle in bundles:
        total.update(bundle)
    return dict(total)


def fits(room: Resources, need: Resources) -> bool:
    return all(room.get(key, 0.0) >= amount for key, amount in need.items())


@dataclass(frozen=True)
class Node:
    """A live Ray node: its id (hex) and its total resources."""

    node_id: str
    resources: Resources


def choose_node(nodes: list[Node], placed: list[str], need: Resources, placement: str) -> str | None:
    """The node the next engine should prefer, given the nodes the fleet's other engines are on (`placed`,
    one entry per engine) and what each engine needs (`need`, all on one node); None: no node has room
    left by this count, so Ray chooses.

    Room is counted against the nodes' totals less the fleet's own engines; other work on a node is not
    known here, which is why the answer is only a preference. `spread`: the fewest engines first, then the
    most room; `pack`: the most engines first, then the least room. Ties go to the lower node id, so the
    choice is the same on every run.
    """
    count = Counter(placed)
    candidates = []
    for node in nodes:
        room = dict(node.resources)
        for key, amount in need.items():
            room[key] = room.get(key, 0.0) - amount * count[node.node_id]
        if fits(room, need):
            spare = sum(room.get(key, 0.0) - amount for key, amount in need.items())
            candidates.append((count[node.node_id], spare, node.node_id))
    if not candidates:
        return None
    if placement == "pack":
        return min(candidates, key=lambda c: (-c[0], c[1], c[2]))[2]
    return min(candidates, key=lambda c: (c[0], -c[1], c[2]))[2]


def engines_held(resources: Resources, need: Resources) -> int:
    """How many engines of `need` a node of `resources` holds at most (nothing else running)."""
    counts = [int(resources.get(key, 0.0) / amount + 1e-9) for key, amount in need.items() if amount > 0]
    return min(counts, default=0)


def refusal(shape: EngineShape, engine_num: int, nodes: list[Node]) -> str | None:
    """Why the cluster `nodes` can never hold `engine_num` engines of `shape` (each on one node), or None.

    Identical engines fit exactly when the nodes' counts of whole engines add up to enough, so this is the
    whole answer for an empty cluster; what other work holds is for `reserve`'s deadline to find.
    """
    need = shape.total
    if sum(engines_held(node.resources, need) for node in nodes) >= engine_num:
        return None
    cpus, gpus = need.get("CPU", 0.0), need.get("GPU", 0.0)
    have = ", ".join(
        f"{n.resources.get('CPU', 0):g} CPUs and {n.resources.get('GPU', 0):g} GPUs" for n in nodes
    )
    return (
        f"{engine_num} engines need {cpus:g} CPUs and {gpus:g} GPUs each, on one node each; the Ray cluster "
        f"has {have or 'no node'} (in all {describe(summed(n.resources for n in nodes))})"
    )


def describe(resources: Resources) -> str:
    """`{'CPU': 2.0, 'GPU': 1.0}` as `2 CPU, 1 GPU`. Left out: memory and object store (bytes, not asked),
    Ray's per-node markers (`node:<ip>`) and the resources it names after placement groups (`CPU_group_<id>`,
    `bundle_group_<id>`: the same CPUs again, as held by groups)."""
    shown = {
        k: v
        for k, v in sorted(resources.items())
        if "memory" not in k and not k.startswith("node:") and "_group_" not in k
    }
    return ", ".join(f"{v:g} {k}" for k, v in shown.items()) or "nothing"


def live_nodes() -> list[Node]:
    """The cluster's live nodes, with their total resources."""
    import ray  # heavy, deferred: the driver's modules import without Ray

    return [Node(n["NodeID"], dict(n["Resources"])) for n in ray.nodes() if n.get("Alive")]


def reserve(shape: EngineShape, target: str | None, name: str, timeout: float) -> Any:
    """A `STRICT_PACK` placement group of `shape`'s bundles, preferring node `target`, once Ray has placed it.

    A group still unplaced after `timeout` seconds is removed and refused, with the resources it asked for
    and those the cluster has and has free: Ray would otherwise keep it pending for ever.
    """
    import ray  # heavy, deferred: the driver's modules import without Ray
    from ray.util.placement_group import placement_group, remove_placement_group  # heavy, deferred: as ray

    group = placement_group(
        [dict(b) for b in shape.bundles], strategy="STRICT_PACK", _soft_target_node_id=target
    )
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(group)
        raise InputError(
            f"{name}: no node could hold its placement group ({len(shape.bundles)} bundles, "
            f"{describe(shape.total)} on one node) within {timeout:g} s; the Ray cluster has "
            f"{describe(ray.cluster_resources())}, of which {describe(ray.available_resources())} free: "
            "lower explorer.rollout_model.engine_cpus or tensor_parallel_size, or give Ray more",
            field="explorer.rollout_model.engine_cpus",
        )
    return group


def group_node(group: Any) -> str:
    """The node (hex id) holding a placed group's bundles (one node: `STRICT_PACK`)."""
    from ray.util.placement_group import (
        placement_group_table,
    )  # heavy, deferred: the driver imports without Ray

    return placement_group_table(group)["bundles_to_node_id"][0]


def release(group: Any) -> None:
    """Give a group's resources back (an engine stopped, or about to be replaced elsewhere)."""
    from ray.util.placement_group import remove_placement_group  # heavy, deferred: as above

    remove_placement_group(group)
