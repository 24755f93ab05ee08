"""Engine placement without Ray: the bundles an engine asks for, the node it prefers, and what is refused."""

from __future__ import annotations

import pytest

from operators.engine.vllm_args import engine_args
from pipelines.control.placement import Node, choose_node, describe, engine_shape, refusal
from schemas.config import load_config
from schemas.engine_config import RolloutModelConfig


def test_a_cpu_engine_is_one_bundle_of_its_cpus_held_by_the_actor():
    shape = engine_shape(1, gpu=False, engine_cpus=2.0)
    assert shape.bundles == ({"CPU": 2.0},)
    assert (shape.actor_cpus, shape.actor_gpus, shape.distributed) == (2.0, 0.0, False)


def test_a_gpu_engine_has_one_bundle_of_one_gpu_per_tensor_parallel_rank():
    single = engine_shape(1, gpu=True, engine_cpus=1.0)
    assert single.bundles == ({"CPU": 1.0, "GPU": 1.0},)
    assert single.actor_gpus == 1.0  # one rank: the actor runs the model on the bundle's GPU

    shape = engine_shape(4, gpu=True, engine_cpus=2.0)
    assert shape.bundles == ({"CPU": 2.0, "GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0})
    assert [b["GPU"] for b in shape.bundles] == [1.0] * 4  # never more than one GPU a bundle (vLLM's rule)
    assert shape.total == {"CPU": 2.0, "GPU": 4.0}
    # the actor keeps its CPUs only: each of vLLM's Ray workers takes one bundle's GPU
    assert (shape.actor_cpus, shape.actor_gpus, shape.distributed) == (2.0, 0.0, True)


def test_only_multi_gpu_engines_run_vllm_ranks_as_ray_workers():
    assert (
        engine_args(RolloutModelConfig(tensor_parallel_size=2), gpu=True)["distributed_executor_backend"]
        == "ray"
    )
    assert engine_args(RolloutModelConfig(), gpu=True)["distributed_executor_backend"] is None
    assert engine_args(RolloutModelConfig(), gpu=False)["distributed_executor_backend"] is None


NODES = [Node("aa", {"CPU": 4.0}), Node("bb", {"CPU": 4.0}), Node("head", {"CPU": 0.5})]
NEED = {"CPU": 2.0}


def test_spread_prefers_the_node_with_fewest_engines_and_skips_nodes_too_small():
    assert choose_node(NODES, [], NEED, "spread") == "aa"  # a tie goes to the lower id
    assert choose_node(NODES, ["aa"], NEED, "spread") == "bb"
    assert choose_node(NODES, ["aa", "bb"], NEED, "spread") == "aa"
    assert choose_node(NODES, ["aa", "aa", "bb", "bb"], NEED, "spread") is None  # full by count: Ray chooses


def test_spread_replaces_an_engine_lost_with_its_node_on_a_survivor():
    survivors = [n for n in NODES if n.node_id != "bb"]
    assert choose_node(survivors, ["aa"], NEED, "spread") == "aa"


def test_pack_fills_a_node_before_the_next():
    assert choose_node(NODES, [], NEED, "pack") == "aa"
    assert choose_node(NODES, ["aa"], NEED, "pack") == "aa"
    assert choose_node(NODES, ["aa", "aa"], NEED, "pack") == "bb"


def test_gpus_count_per_node_for_a_tensor_parallel_engine():
    nodes = [Node("a", {"CPU": 8.0, "GPU": 2.0}), Node("b", {"CPU": 8.0, "GPU": 4.0})]
    need = engine_shape(4, gpu=True, engine_cpus=1.0).total
    assert choose_node(nodes, [], need, "spread") == "b"  # only b holds all four ranks
    assert choose_node(nodes, ["b"], need, "spread") is None


def test_a_cluster_that_can_never_hold_the_engines_is_refused_with_what_it_has():
    shape = engine_shape(2, gpu=True, engine_cpus=1.0)
    nodes = [Node("a", {"CPU": 8.0, "GPU": 1.0}), Node("b", {"CPU": 8.0, "GPU": 1.0})]
    reason = refusal(shape, 1, nodes)  # two GPUs in the cluster, but never two on one node
    assert reason is not None
    assert "1 engines need 1 CPUs and 2 GPUs each, on one node each" in reason
    assert "8 CPUs and 1 GPUs, 8 CPUs and 1 GPUs (in all 16 CPU, 2 GPU)" in reason
    assert refusal(engine_shape(1, False, 2.0), 3, [Node("a", {"CPU": 3.0}), Node("b", {"CPU": 3.0})])
    assert refusal(engine_shape(1, False, 1.5), 4, [Node("a", {"CPU": 3.0}), Node("b", {"CPU": 3.0})]) is None
    no_cluster = refusal(engine_shape(1, False, 1.0), 1, [])
    assert no_cluster.endswith("the Ray cluster has no node (in all nothing)")


def test_describe_leaves_out_byte_counts_node_markers_and_group_resources():
    held = {"CPU_group_ab12": 2.0, "CPU_group_0_ab12": 2.0, "bundle_group_ab12": 1000.0}
    assert (
        describe({"CPU": 4.0, "memory": 1e9, "object_store_memory": 5e8, "node:1.2.3.4": 1.0, **held})
        == "4 CPU"
    )
    assert describe({}) == "nothing"


@pytest.mark.parametrize("value", ["spread", "pack"])
def test_placement_is_a_config_key(value):
    cfg = load_config(None, [f"explorer.rollout_model.placement={value}"])
    assert cfg.explorer.rollout_model.placement == value


def test_an_unknown_placement_is_refused():
    with pytest.raises(Exception, match="placement"):
        load_config(None, ["explorer.rollout_model.placement=scatter"])
