"""A config carrying secrets through a dry run and a short run: no file of the run dir, no MLflow param and
no console line holds them (tests/unit/test_secrets.py checks the masking itself)."""

from __future__ import annotations

import logging

from integration_settings import BASE
from mlflow import MlflowClient

from pipelines.cli import logging_to_console
from pipelines.explore import explore
from pipelines.explore import main as explore_main
from schemas.config import load_config

KEY, PASSWORD = "sk-rftflow-KEY-0042", "pw-rftflow-0042"
SECRETS = [
    *BASE,
    "buffer.total_steps=1",
    f"explorer.rollout_model.api_key={KEY}",  # a secret-named key
    f"buffer.explorer_input.taskset.workflow_args.endpoint=https://rft:{PASSWORD}@tools.example/api",  # a URL
]


def test_no_secret_in_the_console_the_run_dir_or_mlflow(engines, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        explore_main([a for o in SECRETS for a in ("--set", o)] + ["--run-dir", str(run_dir), "--dry-run"])
        == 0
    )
    with logging_to_console(verbose=False):
        logging.getLogger("pipelines").info("store: https://rft:%s@tools.example", PASSWORD)  # any log line
        summary = explore(load_config(None, SECRETS), run_dir, progress=False, engines=engines)
    print(summary.render())
    out, err = capsys.readouterr()
    assert "api_key: '***'" in out and "rft:***@tools.example" in err
    params = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_run_id).data.params
    assert params["explorer.rollout_model.api_key"] == "***"
    seen = [out, err, str(params)]
    seen += [p.read_bytes().decode("latin-1") for p in run_dir.rglob("*") if p.is_file()]
    assert len(seen) > 5 and not [text for text in seen if KEY in text or PASSWORD in text]
