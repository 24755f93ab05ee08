"""The console's quiet defaults (`pipelines.control.console`): which knobs a command sets, that a user's own
setting wins, that `-v` leaves the libraries' chatter on, and that the worker hook silences vLLM's
import-time warnings."""

from __future__ import annotations

import json
import logging
import logging.config
from pathlib import Path

import pytest
import yaml

from pipelines.control import console

KNOBS = ("RAY_DATA_LOGGING_CONFIG", "TORCH_CPP_LOG_LEVEL", "TORCH_LOGS", "VLLM_LOGGING_LEVEL")


@pytest.fixture
def clean_env(monkeypatch):
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


HERMES = "vllm.tool_parsers.hermes_tool_parser"


@pytest.fixture
def vllm_logger():
    logger, parser = logging.getLogger("vllm"), logging.getLogger(HERMES)
    saved = logger.level, list(logger.handlers), logger.propagate, list(parser.filters)
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]
    parser.filters[:] = saved[3]


def test_quiet_defaults_reach_the_driver_and_the_workers(clean_env):
    console.console_defaults(verbose=False)
    env = console.worker_env(verbose=False)
    assert env["worker_process_setup_hook"] == "pipelines.control.console.quiet_worker"
    assert env["env_vars"]["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    assert env["env_vars"]["TORCH_LOGS"] == "-torch._library"  # torch's "Triton not available" warning
    assert "VLLM_LOGGING_LEVEL" not in env["env_vars"]  # the engines' own default (ERROR) applies
    ray_data = yaml.safe_load(Path(env["env_vars"]["RAY_DATA_LOGGING_CONFIG"]).read_text())
    assert ray_data["handlers"]["console"]["level"] == "ERROR"  # Ray Data's INFO and WARNING lines: file only
    assert ray_data["loggers"]["ray.data"]["handlers"] == ["file", "console"]


def test_verbose_leaves_the_libraries_at_their_own_levels(clean_env):
    console.console_defaults(verbose=True)
    env = console.worker_env(verbose=True)
    assert env == {"env_vars": {"VLLM_LOGGING_LEVEL": "INFO"}}  # no hook, no quiet knob


def test_a_setting_the_user_made_is_kept(clean_env):
    clean_env.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    console.console_defaults(verbose=False)
    assert console.worker_env(verbose=False)["env_vars"]["TORCH_CPP_LOG_LEVEL"] == "INFO"


def test_the_worker_hook_drops_vllms_import_warnings(clean_env, vllm_logger):
    importing = logging.getLogger("vllm.triton_utils.importing")  # where "Triton is installed, but ..." is
    vllm_logger.setLevel(logging.NOTSET)
    console.quiet_worker()
    assert not importing.isEnabledFor(logging.WARNING)
    assert importing.isEnabledFor(logging.ERROR)  # real errors still show


def test_the_worker_hook_follows_vllm_logging_level(clean_env, vllm_logger):
    clean_env.setenv("VLLM_LOGGING_LEVEL", "info")
    console.quiet_worker()
    assert logging.getLogger("vllm.triton_utils.importing").isEnabledFor(logging.INFO)
    assert logging.getLogger(HERMES).filters == []


def test_the_worker_hook_leaves_out_the_tool_parsers_fallback_tracebacks(clean_env, vllm_logger):
    """A malformed call sampled by the model is answered as text; its traceback is not the run's error. The
    filter must outlast vLLM's own logging configuration, which it reapplies as an engine starts."""
    clean_env.setenv("VLLM_LOGGING_LEVEL", "ERROR")  # as the engines are launched (pipelines.control.launch)
    console.quiet_worker()
    assert HERMES in console.tool_parser_loggers()
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False, "loggers": {"vllm": {}}})
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    vllm_logger.addHandler(handler)
    try:
        try:
            json.loads('{"name": "calculator", "arguments": {"expression": "69')
        except ValueError:
            logging.getLogger(HERMES).exception("Error in extracting tool call from response.")
        logging.getLogger("vllm.v1.engine.core").error("a real engine error")
    finally:
        vllm_logger.removeHandler(handler)
    assert [record.getMessage() for record in seen] == ["a real engine error"]
