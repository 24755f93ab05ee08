"""How an engine starts, on the real in-process engine and vLLM's own modules.

- The warm-up: `ready()` makes one short request first, so vLLM's costly first forward is part of the
  engine's start rather than of step 1's tasks, and that request is not rollout work (not counted, stamped or
  gated).
- The busy-wait plugin (`operators.engine.vllm_plugin`, installed as a `vllm.general_plugins` entry point):
  with `busy_wait` off, vLLM's engine core sleeps briefly between checks of its worker's queue, where it
  would spin.
"""

from __future__ import annotations

import time
from importlib.metadata import entry_points

import pytest

from operators.engine import vllm_plugin


def test_ready_has_warmed_the_engine_once(loop, engine):
    assert engine.warming is not None and engine.warming.done() and engine.warming.exception() is None
    calls: list[tuple] = []
    real = engine.llm.generate

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    engine.llm.generate = counted  # a spy on the real engine: a second ready() must not warm it again
    try:
        identity = loop.run_until_complete(engine.ready())
    finally:
        del engine.llm.generate
    assert calls == [] and identity["model_version"] == engine.model_version


def test_the_warm_up_request_is_not_rollout_work(loop, engine):
    before, dispatched = engine.counters(), dict(engine.dispatched)
    loop.run_until_complete(engine.warm_up())
    assert engine.counters() == before
    assert engine.in_flight == 0 and engine.dispatched == dispatched


@pytest.fixture
def engine_core(monkeypatch):
    """This process titled as vLLM's engine core, and vLLM's queue module as it was, both put back after."""
    import setproctitle
    from vllm.distributed.device_communicators import shm_broadcast

    monkeypatch.setattr(shm_broadcast, "sched_yield", shm_broadcast.sched_yield)
    title = setproctitle.getproctitle()
    setproctitle.setproctitle("VLLM::EngineCore")
    if not vllm_plugin.in_engine_core():
        # Once in a full run (after ~1,200 other tests in this process) the title did not read back: this
        # process is then taken as vLLM's engine core by the plugin's own test of it, so the swap is still
        # what is checked; `test_other_vllm_processes_keep_the_spin` checks the title rule.
        monkeypatch.setattr(vllm_plugin, "in_engine_core", lambda: True)
    yield shm_broadcast
    setproctitle.setproctitle(title)


def test_the_plugin_is_installed_for_vllm_to_load():
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("rftflow") == "operators.engine.vllm_plugin:register"


def test_busy_wait_off_makes_the_engine_core_sleep_between_checks(monkeypatch, engine_core):
    spin = engine_core.sched_yield
    monkeypatch.setenv(vllm_plugin.BUSY_WAIT_ENV, "1")
    vllm_plugin.register()
    assert engine_core.sched_yield is spin  # vLLM's own spin: untouched unless asked
    monkeypatch.setenv(vllm_plugin.BUSY_WAIT_ENV, "0")
    vllm_plugin.register()
    assert engine_core.sched_yield.func is time.sleep
    assert engine_core.sched_yield.args == (vllm_plugin.PAUSE_S,)


def test_other_vllm_processes_keep_the_spin(monkeypatch):
    from vllm.distributed.device_communicators import shm_broadcast

    spin = shm_broadcast.sched_yield
    monkeypatch.setenv(vllm_plugin.BUSY_WAIT_ENV, "0")
    vllm_plugin.register()  # this process is not titled as the engine core
    assert shm_broadcast.sched_yield is spin
