"""What a run prints without `-v`: rftflow's own lines (starting Ray, starting each engine, ready) and real
errors, as `vllm serve` and `ray` do at their defaults; `-v` shows everything.

Each library has its own knob for its start-up chatter, and each reads it once, early: Ray Data reads
`RAY_DATA_LOGGING_CONFIG` when `ray.data` is first imported, torch's C++ code reads `TORCH_CPP_LOG_LEVEL`
when it loads, vLLM reads `VLLM_LOGGING_LEVEL` only once it configures its logging, after the import-time
warnings it prints on a CPU host ("Triton is installed, but doesn't include CPU backend"). So a command sets
the environment first thing (`console_defaults`), before Ray Data is imported and before Ray starts (Ray's
processes inherit it, and `worker_env` carries it to a cluster's workers), and every Ray worker sets the
`vllm` logger's level before it imports vLLM (`quiet_worker`, Ray's `worker_process_setup_hook`).

Kept to the standard library: Ray imports this module in every worker process.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

RAY_DATA_LOGGING = Path(__file__).with_name("ray_data_logging.yaml")  # Ray Data's console at ERROR
QUIET_ENV = {
    "RAY_DATA_LOGGING_CONFIG": str(RAY_DATA_LOGGING),
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings, e.g. vLLM's CPU worker's NUMA binding notice
    # torch's custom-op registration warns, in every engine process, that Triton is absent (the CPU install
    # removes it: it has no CPU backend); torch applies TORCH_LOGS when it is imported
    "TORCH_LOGS": "-torch._library",
}
VERBOSE_ENV = {"VLLM_LOGGING_LEVEL": "INFO"}
QUIET_VLLM_LEVEL = "ERROR"  # what the engines log at unless VLLM_LOGGING_LEVEL says otherwise
TOOL_PARSERS = "vllm.tool_parsers"  # the package of vLLM's tool-call parsers, one logger per module
WORKER_HOOK = f"{__name__}.quiet_worker"


def console_defaults(verbose: bool) -> None:
    """Set the libraries' logging knobs for this command, keeping any the user set: quiet ones by default,
    vLLM at INFO with `verbose`. Call it before anything imports `ray.data` or starts Ray."""
    for name, value in (VERBOSE_ENV if verbose else QUIET_ENV).items():
        os.environ.setdefault(name, value)


def worker_env(verbose: bool) -> dict:
    """The Ray job's `runtime_env`: the knobs `console_defaults` set (a joined cluster's workers do not
    inherit the driver's environment) and, unless `verbose`, the hook that quiets vLLM's import."""
    env = {"env_vars": {name: os.environ[name] for name in (*QUIET_ENV, *VERBOSE_ENV) if name in os.environ}}
    return env if verbose else {**env, "worker_process_setup_hook": WORKER_HOOK}


def quiet_worker() -> None:
    """Ray's `worker_process_setup_hook`: the `vllm` logger at `VLLM_LOGGING_LEVEL` (ERROR when unset)
    before vLLM is imported, so the warnings it logs while importing, before its own logging is set up,
    follow the level it is given too. At the quiet level the tool-call parsers' fallback tracebacks are left
    out as well (the engines are launched with `VLLM_LOGGING_LEVEL=ERROR` unless the user set it)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", QUIET_VLLM_LEVEL).upper()
    logging.getLogger("vllm").setLevel(level)
    if level in (QUIET_VLLM_LEVEL, "CRITICAL"):
        for name in tool_parser_loggers():
            logging.getLogger(name).addFilter(ParserFallbacks())


class ParserFallbacks(logging.Filter):
    """Drops a tool-call parser's ERROR records. vLLM's parsers log one, with a whole traceback, for each
    reply whose call is not valid JSON, and then answer with the text as content (a 200): for a policy in
    training that is an ordinary sample, recorded as sampled, not the run's error.

    A filter on each parser's own logger, because vLLM reapplies its logging configuration when an engine
    starts, which resets the levels of the `vllm` logger's children (a filter stays)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno != logging.ERROR


def tool_parser_loggers() -> list[str]:
    """The logger names of vLLM's tool-parser modules, found on disk without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / TOOL_PARSERS.split(".", 1)[1]
    modules = (module.stem for module in folder.glob("*.py") if module.stem != "__init__")
    return sorted(f"{TOOL_PARSERS}.{stem}" for stem in modules)
