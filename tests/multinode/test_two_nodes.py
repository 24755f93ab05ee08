"""A real multi-node run: two engines on two Ray worker nodes, then one node removed mid-run.

The cluster (`ray.cluster_utils.Cluster`, three nodes on this machine) runs in a process of its own
(`two_nodes_run.py`): the other tests share one session Ray, which a second cluster in this process would
collide with. This test starts it in a new session, checks what it reports and wrote, and leaves none of its
processes behind: after a normal end none may be left, and after a failure or a timeout they are killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("two_nodes_run.py")
RUN_S = 540  # the script's own deadline, inside the test's
EXIT_S = 30  # how long the cluster's processes may take to exit after the script has


def processes_of(session: int, address: str | None) -> list[int]:
    """Live processes of the script's session, or of its Ray cluster (their command lines name its GCS)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            sid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[4])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if sid == session or (address and address in cmdline):
            found.append(int(proc.name))
    return found


def left_after(session: int, out: Path, wait: float) -> list[int]:
    """The script's processes still alive `wait` seconds after it ended (they are given time to exit)."""
    cluster = out / "cluster.json"
    address = json.loads(cluster.read_text())["address"] if cluster.exists() else None
    deadline = time.monotonic() + wait
    while (left := processes_of(session, address)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def run_script(out: Path) -> tuple[int, float]:
    """Run the two-node script to its end, or kill it and its cluster; its exit code and run time."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.monotonic()
    with open(out / "run.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(out)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        try:
            code = proc.wait(timeout=RUN_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            left = left_after(proc.pid, out, EXIT_S if proc.poll() is not None else 0)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    os.kill(pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait(timeout=EXIT_S)
    tail = (out / "run.log").read_text(errors="replace")[-6000:]
    assert code is not None, f"the two-node run took over {RUN_S} s:\n{tail}"
    assert code == 0, f"the two-node run failed ({code}):\n{tail}"
    assert left == [], f"processes left behind by the two-node run: {left}"
    return code, time.monotonic() - started


def keys(table) -> list[tuple[str, int]]:
    return list(zip(table.column("task_uid").to_pylist(), table.column("run_id").to_pylist(), strict=True))


@pytest.mark.slow(reason="a three-node Ray cluster and two engines, each run started afresh: 80-190 s")
@pytest.mark.timeout(RUN_S + 2 * EXIT_S + 30)  # a cluster of three nodes and two engines, twice started
def test_engines_spread_over_two_nodes_and_a_lost_node_is_replaced_on_the_survivor(tmp_path):
    _, took = run_script(tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    print(f"two-node run: {took:.0f} s in all; report {json.dumps(report)}")
    workers, run, version = report["nodes"], report["run"], report["run"]["version"]

    # each engine ran where its placement group was placed, one engine per worker node
    before = report["before"]
    assert before["running"] == before["placed"]
    assert sorted(before["placed"]) == sorted(workers.values())

    undisturbed = pq.read_table(tmp_path / "undisturbed" / "experiences")
    expected = keys(undisturbed)
    assert (
        len(expected) == len(set(expected)) == run["steps"] * run["batch"] * run["repeat"]
    )  # each committed exactly once

    # an engine's node (not the driver's) went after step 2 was committed; its engine came back on the
    # survivor, on version 5
    lost = report["removed"]["node"]
    survivor = next(node for node in workers.values() if node != lost)
    assert lost in before["placed"] and lost not in (report["driver_node"], report["gate_node"])
    assert report["removed"]["after_step"] >= report["remove_after_step"]
    assert lost not in report["alive_nodes"]
    assert report["restarts"] == 1
    after = report["after"]
    assert after["placed"] == after["running"] == [survivor, survivor]
    assert after["versions"] == [version, version] and after["holds_version_5"] == [True, True]

    disturbed = pq.read_table(tmp_path / "disturbed" / "experiences")
    got = keys(disturbed)
    assert len(got) == len(set(got)) and set(got) == set(expected)  # nothing lost, nothing twice
    assert report["failed"] == 0  # requests lost with the node were sent again, not failed
    later = disturbed.filter(pc.greater(disturbed.column("step"), report["remove_after_step"]))
    assert set(later.column("model_version").to_pylist()) == {version}
