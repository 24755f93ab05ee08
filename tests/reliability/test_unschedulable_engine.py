"""An engine the cluster can never schedule is refused at once with what it asked for and what the cluster
has, instead of the driver waiting on a pending actor for ever."""

from __future__ import annotations

import time

import pytest

from pipelines.control.fleet import EngineFleet
from pipelines.control.runtime import init_ray
from pipelines.explore import main
from schemas.config import RayConfig, load_config
from schemas.errors import InputError


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    init_ray(RayConfig(num_cpus=4))


def test_an_engine_asking_for_more_cpus_than_any_node_has_is_refused_before_it_is_made():
    cfg = load_config(None, ["explorer.rollout_model.engine_cpus=64"])
    fleet = EngineFleet(cfg, "unschedulable")
    with pytest.raises(InputError, match=r"need 64 CPUs and 0 GPUs each; the Ray cluster has 4 CPUs"):
        fleet.launch()
    assert fleet.handles == []  # no actor was made to wait on


def test_the_cli_says_so_with_exit_2_within_seconds(tmp_path, capsys):
    started = time.monotonic()
    code = main(
        ["--set", "explorer.rollout_model.engine_num=8", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    )
    assert code == 2 and time.monotonic() - started < 120  # the deadline: no wait on a pending actor
    err = capsys.readouterr().err
    assert "error: field 'explorer.rollout_model.engine_cpus': 8 engines need 1 CPUs" in err
    assert "Traceback" not in err
