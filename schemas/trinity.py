"""Trinity-RFT configs, recognised by their own keys and translated to rftflow's, so a migrating user brings
the YAML as it is.

Each explorer-side key maps to the rftflow key with its meaning; where the two systems' defaults differ, the
reference's apply (Trinity's configs were written against them). Trainer-side sections are ignored with one
notice each. Explorer features rftflow lacks are refused with the key and the reason, since running without
them would write different experiences; the experience pipeline's two reward filters become experience ops.
OmegaConf interpolation (`${oc.env:VAR,default}`, `${a.b}`) is resolved with OmegaConf itself first.
"""

from __future__ import annotations

import copy
from typing import Any

from schemas.errors import InputError
from schemas.interpolation import resolve

# not `mode`: rftflow's own configs have it too (explore | bench)
MARKERS = ("algorithm", "cluster", "trainer", "checkpoint_root_dir", "data_processor", "service")
MODES_RUN = ("explore", "both", "bench")
MODES_REFUSED = {"train": "the trainer is yours", "serve": "a serving mode", "colocate": "colocated training"}
WORKFLOWS = {"math_workflow": "math", "math_boxed_workflow": "math_boxed"}
REWARDS = {
    "math_reward": "math_accuracy",
    "accuracy_reward": "math_accuracy",
    "format_reward": "format",
    "math_boxed_reward": "math_boxed_accuracy",
    "countdown_reward": "countdown",
}
SYNC_METHODS = {
    "nccl": "broadcast",
    "online": "broadcast",
    "checkpoint": "checkpoint",
    "offline": "checkpoint",
}
SYNC_METHODS["memory"] = "memory"
# The reference's reward filters, as (op, argument its `threshold` becomes): both keep what they kept there.
OPERATORS = {
    "reward_filter": ("reward_filter", "min_reward"),
    "reward_std_filter": ("reward_std_filter", "threshold"),
}
SYNC_STYLES = {"trainer_driven": "dynamic_by_trainer", "explorer_driven": "dynamic_by_explorer"}
SAMPLING = ("temperature", "top_p", "top_k", "logprobs")
ENGINE_KEYS = ("engine_num", "tensor_parallel_size", "dtype", "gpu_memory_utilization", "seed")
ENGINE_KEYS += ("enable_openai_api", "tool_call_parser", "reasoning_parser", "enable_chunked_prefill")
EXPLORER_KEYS = ("runner_per_model", "max_timeout", "max_retry_times", "max_repeat_times_per_runner")
EXPLORER_KEYS += ("eval_interval", "eval_on_startup", "bench_on_latest_checkpoint")
TAIL_KEYS = {"over_rollout": ("ratio", "wait_after_min"), "dynamic_timeout": ("enable", "ratio")}
TASKSET_KEYS = ("name", "path", "rollout_args", "workflow_args", "reward_fn_args", "repeat_times")
TASKSET_KEYS += ("default_workflow_type", "default_reward_fn_type", "subset_name", "split")
# The reference's defaults where they differ from rftflow's (Trinity-RFT v0.5.2, trinity/common/config.py).
DEFAULTS = {"repeat_times": 1, "max_timeout": 1800.0, "sync_timeout": 3600.0, "dtype": "bfloat16", "seed": 42}


def section(tree: Any, *keys: str) -> dict[str, Any]:
    for key in keys:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree if isinstance(tree, dict) else {}


def is_trinity(tree: dict[str, Any]) -> bool:
    """A Trinity-RFT config: it has a key, or a value, only Trinity's configs have."""
    taskset = section(tree, "buffer", "explorer_input", "taskset")
    experience_buffer = section(tree, "buffer", "trainer_input", "experience_buffer")
    return (
        any(k in tree for k in MARKERS)
        or "max_response_tokens" in section(tree, "model")
        or "storage_type" in taskset
        or experience_buffer.get("storage_type") in ("queue", "file")
    )


class Translation:
    """One Trinity config becoming rftflow's: the native tree and a notice per ignored or changed key."""

    def __init__(self, tree: dict[str, Any], source: str):
        self.src = tree
        self.source = source
        self.out: dict[str, Any] = {}
        self.notices: list[str] = []

    def refuse(self, key: str, why: str) -> None:
        raise InputError(
            f"Trinity key {key}: {why}; rftflow's explorer does not have it", file=self.source, field=key
        )

    def put(self, dotted: str, value: Any) -> None:
        node = self.out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def ignore(self, key: str, why: str = "trainer-side") -> None:
        self.notices.append(f"{key}: ignored ({why})")

    def run(self) -> dict[str, Any]:
        src = self.src
        for key in ("project", "name"):
            if key in src:
                self.put(key, src[key])
        self.mode()
        self.model()
        self.buffer()
        self.explorer()
        self.synchronizer()
        self.monitor()
        if "cluster" in src:
            cluster = dict(src["cluster"] or {})
            if cluster.pop("ray_address", None) not in (None, "auto"):
                self.put("ray.address", src["cluster"]["ray_address"])
            for key in cluster:
                self.ignore(f"cluster.{key}", "the GPU layout is Ray's")
        if "checkpoint_root_dir" in src:
            root = (
                f"{src['checkpoint_root_dir']}/{src.get('project', 'Trinity-RFT')}/{src.get('name', 'rft')}"
            )
            self.put("synchronizer.checkpoint_dir", root)
        self.data_processor()
        for key in (
            "trainer",
            "service",
            "stages",
            "log",
            "continue_from_checkpoint",
            "ray_namespace",
            "group",
        ):
            if key in src:
                self.ignore(key)
        algorithm = dict(src.get("algorithm") or {})
        algorithm.pop("repeat_times", None)
        for key in algorithm:
            self.ignore(f"algorithm.{key}")
        return self.out

    def mode(self) -> None:
        mode = self.src.get("mode", "both")
        if mode in MODES_REFUSED:
            self.refuse("mode", f"mode {mode} ({MODES_REFUSED[mode]}) is not an explorer run")
        if mode not in MODES_RUN:
            self.refuse("mode", f"unknown mode {mode!r}")
        if mode == "both":
            self.notices.append(
                "mode both: the explorer side runs here; the trainer is yours (or --with-trainer)"
            )
        if mode == "bench":
            self.put("mode", "bench")

    def model(self) -> None:
        model = dict(self.src.get("model") or {})
        for key in ("lora_configs", "tinker", "external_model", "custom_chat_template"):
            if model.get(key):
                self.refuse(
                    f"model.{key}", "LoRA, Tinker, external models and chat templates are not supported"
                )
        if "model_path" in model:
            self.put("model.model_path", model["model_path"])
        for key, target in (("max_model_len", "max_model_len"), ("max_prompt_tokens", "max_prompt_tokens")):
            if model.get(key) is not None:
                self.put(f"explorer.rollout_model.{target}", model[key])
        self.sampling = {k: model[k] for k in SAMPLING if model.get(k) is not None}
        if model.get("max_response_tokens") is not None:
            self.sampling["max_tokens"] = model["max_response_tokens"]
        if model.get("enable_prompt_truncation") is not None:
            self.ignore(
                "model.enable_prompt_truncation", "rftflow refuses an overlong prompt: prompt_overflow"
            )

    def taskset(
        self, node: dict[str, Any], where: str, defaults: dict[str, Any], is_eval: bool
    ) -> dict[str, Any]:
        storage = node.get("storage_type", "file")
        if storage != "file":
            self.refuse(
                f"{where}.storage_type", f"a {storage} taskset (rftflow reads jsonl and Parquet files)"
            )
        out = {k: copy.deepcopy(node[k]) for k in TASKSET_KEYS if k in node}
        out.setdefault("repeat_times", 1 if is_eval else self.repeat_times)
        out["rollout_args"] = {**self.sampling, **(out.get("rollout_args") or {})}
        for key, value in defaults.items():
            if value is not None and out.get(key) is None:
                out[key] = value
        out["default_workflow_type"] = WORKFLOWS.get(
            out.get("default_workflow_type"), out.get("default_workflow_type")
        )
        out["default_reward_fn_type"] = REWARDS.get(
            out.get("default_reward_fn_type"), out.get("default_reward_fn_type")
        )
        if "format" in node:
            out["format"] = {
                k: v for k, v in node["format"].items() if k in ("prompt_key", "response_key", "messages_key")
            }
        for key in set(node) - set(TASKSET_KEYS) - {"format", "storage_type"}:
            self.ignore(f"{where}.{key}", "not an explorer setting here")
        return {k: v for k, v in out.items() if v is not None}

    def buffer(self) -> None:
        buffer = dict(self.src.get("buffer") or {})
        self.repeat_times = (self.src.get("algorithm") or {}).get("repeat_times", DEFAULTS["repeat_times"])
        for key in ("batch_size", "total_epochs", "total_steps"):
            if key in buffer:
                self.put(f"buffer.{key}", buffer[key])
        inputs = dict(buffer.get("explorer_input") or {})
        defaults = {k: inputs.get(k) for k in ("default_workflow_type", "default_reward_fn_type")}
        prefix = "buffer.explorer_input"
        if inputs.get("taskset"):
            self.put(
                f"{prefix}.taskset", self.taskset(inputs["taskset"], f"{prefix}.taskset", defaults, False)
            )
        evals = inputs.get("eval_tasksets") or []
        if evals:
            self.put(f"{prefix}.eval_tasksets", [
                self.taskset(ts, f"{prefix}.eval_tasksets.{i}", defaults, True) for i, ts in enumerate(evals)
            ])  # fmt: skip
        if inputs.get("default_eval_workflow_type"):
            name = inputs["default_eval_workflow_type"]
            self.put(f"{prefix}.default_eval_workflow_type", WORKFLOWS.get(name, name))
        self.experience_buffer(dict((buffer.get("trainer_input") or {}).get("experience_buffer") or {}))
        for key in set(buffer) - {
            "batch_size",
            "total_epochs",
            "total_steps",
            "explorer_input",
            "trainer_input",
        }:
            self.ignore(f"buffer.{key}")

    def experience_buffer(self, node: dict[str, Any]) -> None:
        where = "buffer.trainer_input.experience_buffer"
        storage = node.get("storage_type")
        path = node.get("path")
        if storage in ("queue", "sql") and isinstance(path, str) and "://" in path or storage == "sql":
            self.put(f"{where}.storage_type", "sql")
            if path:
                self.put(f"{where}.path", path)
            if node.get("name"):
                self.put(f"{where}.name", node["name"])
        elif storage in ("queue", "file", None):
            self.notices.append(
                f"{where}.storage_type {storage}: written as Parquet step folders in the run dir"
            )
        else:
            self.refuse(f"{where}.storage_type", f"storage {storage!r}")
        for key in set(node) - {"storage_type", "path", "name"}:
            self.ignore(f"{where}.{key}", "the reading side is the trainer's")

    def explorer(self) -> None:
        explorer = dict(self.src.get("explorer") or {})
        self.put("explorer.max_timeout", explorer.get("max_timeout", DEFAULTS["max_timeout"]))
        for key in EXPLORER_KEYS:
            if key in explorer:
                self.put(f"explorer.{key}", explorer[key])
        for name, keys in TAIL_KEYS.items():  # the reference's over-rollout and dynamic timeout, by sub-key
            given = explorer.get(name) if isinstance(explorer.get(name), dict) else {}
            for key, value in given.items():
                if key in keys:
                    self.put(f"explorer.{name}.{key}", value)
                else:
                    self.ignore(f"explorer.{name}.{key}", "not an rftflow setting")
        if explorer.get("auxiliary_models"):
            self.refuse("explorer.auxiliary_models", "auxiliary models are not supported")
        rollout = dict(explorer.get("rollout_model") or {})
        for key in ("dtype", "seed"):
            self.put(f"explorer.rollout_model.{key}", rollout.get(key, DEFAULTS[key]))
        for key in ENGINE_KEYS:
            if key in rollout:
                self.put(f"explorer.rollout_model.{key}", rollout[key])
        for key in set(rollout) - set(ENGINE_KEYS):
            self.ignore(f"explorer.rollout_model.{key}", "a vLLM option rftflow sets itself")
        for key in (
            set(explorer)
            - set(EXPLORER_KEYS)
            - {"rollout_model", "auxiliary_models", "max_timeout", *TAIL_KEYS}
        ):
            self.ignore(f"explorer.{key}", "not an rftflow explorer setting")

    def synchronizer(self) -> None:
        sync = dict(self.src.get("synchronizer") or {})
        method = sync.pop("sync_method", "nccl")
        if method not in SYNC_METHODS:
            self.refuse("synchronizer.sync_method", f"unknown method {method!r}")
        native = SYNC_METHODS[method]
        if native == "broadcast":  # only the explorer runs here: the reference syncs by checkpoint then
            native = "checkpoint"
            self.notices.append(
                f"synchronizer.sync_method {method}: checkpoint, as the reference's explore mode"
            )
        self.put("synchronizer.sync_method", native)
        style = sync.pop("sync_style", None)
        if style is not None:
            self.put("synchronizer.sync_style", SYNC_STYLES.get(style, style))
        self.put("synchronizer.sync_timeout", sync.pop("sync_timeout", DEFAULTS["sync_timeout"]))
        for key in ("sync_interval", "sync_offset"):
            if key in sync:
                self.put(f"synchronizer.{key}", sync.pop(key))
        for key in sync:
            self.ignore(f"synchronizer.{key}", "the trainer's side of the sync")

    def monitor(self) -> None:
        monitor = dict(self.src.get("monitor") or {})
        kind = monitor.get("monitor_type", "mlflow")
        if kind == "mlflow" and (monitor.get("monitor_args") or {}).get("uri"):
            self.put("monitor.mlflow_uri", monitor["monitor_args"]["uri"])
        elif kind != "mlflow":
            self.notices.append(f"monitor.monitor_type {kind}: rftflow tracks in MLflow")

    def data_processor(self) -> None:
        """The reference's two reward filters become rftflow's experience ops; any other operator would write
        different experiences, so it is refused."""
        processor = dict(self.src.get("data_processor") or {})
        operators = (processor.pop("experience_pipeline", None) or {}).get("operators") or []
        ops = []
        for i, op in enumerate(operators):
            key = f"data_processor.experience_pipeline.operators.{i}"
            name = op.get("name") if isinstance(op, dict) else op
            args = dict((op.get("args") if isinstance(op, dict) else None) or {})
            if name not in OPERATORS:
                self.refuse(key, f"experience operator {name!r} changes what is written")
            threshold = args.pop("threshold", 0.0)
            if args:
                self.refuse(f"{key}.args", f"{name} arguments {sorted(args)} (only threshold)")
            target, arg = OPERATORS[name]
            ops.append({"name": target, "args": {arg: threshold}})
        if ops:
            self.put("buffer.explorer_input.experience_ops", ops)
        for key in processor:
            self.ignore(f"data_processor.{key}")


def translate(tree: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """rftflow's config tree for a Trinity-RFT one, and the notices about what was ignored or changed."""
    translation = Translation(resolve(tree, source), source)
    return translation.run(), translation.notices
