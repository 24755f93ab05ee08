"""The one Ray namespace of rftflow's named actors, and lookups by name.

Engines, the step gate, the weight hub and the experience queue are found by name, from the driver and from
Ray Data workers on any node alike, so the names and their namespace live here, below everything that uses
them.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "rftflow"


def find_actor(name: str) -> Any | None:
    """The actor registered under `name` now, or None (between a replacement's kill and its creation)."""
    import ray  # heavy, deferred: the driver's modules import without Ray

    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def on_this_node() -> dict[str, Any]:
    """Actor options that keep a run's small named actor (the step gate, the weight hub, the experience
    queue) on the node of the process that makes it, the driver's. Left to Ray, a zero-CPU actor may land on
    any worker node, and losing that node would end the run, where losing an engine or a forwarder is healed.
    Soft: should that node refuse it, Ray places it elsewhere rather than never."""
    import ray  # heavy, deferred: the driver's modules import without Ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # heavy, deferred: as ray

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=True)}


ACTOR_CALL_S = 60.0  # a small named actor (gate, hub, queue) that does not answer in a minute is gone


def get_within(ref: Any, what: str, timeout: float = ACTOR_CALL_S) -> Any:
    """`ray.get` with a deadline: no wait without one, and the message names what was waited for."""
    import ray  # heavy, deferred: the driver's modules import without Ray

    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"{what}: no answer within {timeout:g} s") from None
