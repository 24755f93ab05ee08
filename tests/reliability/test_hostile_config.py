"""Hostile configuration through the real CLI: unknown keys and out-of-range values end in exit code 2 and one
`error:` line naming the dotted key, before anything starts (no run dir, no Ray), never in a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines.explore import main

TASKSET = "buffer.explorer_input.taskset"
ROLLOUT = "explorer.rollout_model"
BUFFER = "buffer.trainer_input.experience_buffer"


def case(name: str, key: str, value: str, fragment: str, named: str | None = None) -> Any:
    """`--set key=value`, refused with `named` (default: the key itself) and a fragment of the reason."""
    return pytest.param(f"{key}={value}", named or key, fragment, id=name)


AT_LEAST = "greater than or equal to"
EXTRA = "Extra inputs are not permitted"
BAD_SETTINGS = [
    case("unknown-key", f"{TASKSET}.bogus", "1", EXTRA),
    case("unknown-section", "nosuch.key", "1", EXTRA, named="nosuch"),
    case(
        "unknown-key-in-a-list",
        "buffer.explorer_input.eval_tasksets",
        "[{name: e, bogus: 1}]",
        EXTRA,
        named="buffer.explorer_input.eval_tasksets.0.bogus",
    ),
    case("into-a-value", "name.sub", "1", "Input should be a valid string", named="name"),
    case("negative-batch-size", "buffer.batch_size", "-1", f"{AT_LEAST} 1"),
    case("text-batch-size", "buffer.batch_size", "lots", "valid integer"),
    case("zero-epochs", "buffer.total_epochs", "0", f"{AT_LEAST} 1"),
    case("negative-temperature", f"{TASKSET}.rollout_args.temperature", "-0.5", f"{AT_LEAST} 0"),
    case("top-p-over-1", f"{TASKSET}.rollout_args.top_p", "1.5", "less than or equal to 1"),
    case("top-p-zero", f"{TASKSET}.rollout_args.top_p", "0", "greater than 0"),
    case("top-k-below-minus-1", f"{TASKSET}.rollout_args.top_k", "-2", f"{AT_LEAST} -1"),
    case("zero-max-tokens", f"{TASKSET}.rollout_args.max_tokens", "0", f"{AT_LEAST} 1"),
    case("zero-repeats", f"{TASKSET}.repeat_times", "0", f"{AT_LEAST} 1"),
    case("unknown-bad-row-policy", f"{TASKSET}.on_bad_row", "ignore", "'raise' or 'skip'"),
    case("zero-max-row-bytes", f"{TASKSET}.max_row_bytes", "0", f"{AT_LEAST} 1"),
    case(
        "max-row-bytes-over-1-gib", f"{TASKSET}.max_row_bytes", str(2**31), "less than or equal to 1073741824"
    ),
    case("zero-max-prompt-tokens", f"{ROLLOUT}.max_prompt_tokens", "0", f"{AT_LEAST} 1"),
    case(
        "max-prompt-tokens-leaving-no-room",
        f"{ROLLOUT}.max_prompt_tokens",
        "256",
        "max_prompt_tokens (256) must be below max_model_len (256)",
        named=ROLLOUT,
    ),
    case("unknown-overflow", f"{ROLLOUT}.prompt_overflow", "cut", "'refuse' or 'truncate'"),
    case("gpu-memory-over-1", f"{ROLLOUT}.gpu_memory_utilization", "2", "less than or equal to 1"),
    case("zero-engines", f"{ROLLOUT}.engine_num", "0", f"{AT_LEAST} 1"),
    case("zero-timeout", "explorer.max_timeout", "0", "greater than 0"),
    case("negative-retries", "explorer.max_retry_times", "-1", f"{AT_LEAST} 0"),
    case("unknown-sync-method", "synchronizer.sync_method", "rsync", "'none', 'checkpoint'"),
    case("negative-staleness", "synchronizer.max_staleness", "-1", f"{AT_LEAST} 0"),
    case("unknown-store", f"{BUFFER}.storage_type", "mongodb", "'parquet' or 'sql'"),
    case("table-name-with-sql", f"{BUFFER}.name", "'x; drop table y'", "should match pattern"),
    case("zero-queue-capacity", f"{BUFFER}.queue_capacity", "0", f"{AT_LEAST} 1"),
    case("tiny-object-store", "ray.object_store_memory_mib", "1", f"{AT_LEAST} 64"),
]


@pytest.mark.parametrize(("override", "key", "fragment"), BAD_SETTINGS)
def test_a_bad_setting_is_refused_naming_its_key(tmp_path, capsys, override, key, fragment):
    run_dir = tmp_path / "run"
    assert main(["--set", override, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --set, field '{key}': ") and fragment in err
    assert err.count("\n") == 1 and not run_dir.exists()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("buffer:\n  batch_size: 4\n  bogus: 1\n", "field 'buffer.bogus': Extra inputs are not permitted"),
        (
            "buffer:\n  batch_size: -4\n",
            "field 'buffer.batch_size': Input should be greater than or equal to 1",
        ),
        ("- just\n- a list\n", "the top level must be a mapping"),
        ("buffer: {batch_size: [\n", "not valid YAML"),
    ],
    ids=["unknown-key", "out-of-range", "not-a-mapping", "not-yaml"],
)
def test_a_bad_config_file_is_refused_naming_the_file_and_key(tmp_path, capsys, text, where):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    assert main(["--config", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and where in err  # YAML's own reason may take a few lines


def test_the_cli_process_exits_2_with_one_line_and_starts_nothing(tmp_path):
    """In a process of its own: the exit code, stderr, and that Ray was never started."""
    run_dir = tmp_path / "run"
    code = (
        "import json, sys\n"
        "from pipelines.explore import main\n"
        f"code = main(['--set', 'buffer.batch_size=-1', '--set', 'x.y=1', '--run-dir', {str(run_dir)!r}])\n"
        "ray = sys.modules.get('ray')\n"
        "print(json.dumps([code, bool(ray and ray.is_initialized()), 'vllm' in sys.modules]))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout) == [2, False, False]
    assert out.stderr == (
        "error: --set, field 'buffer.batch_size': Input should be greater than or equal to 1 (and 1 more)\n"
    )
    assert not run_dir.exists()
