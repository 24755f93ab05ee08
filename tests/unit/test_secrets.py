"""URL passwords and secret-named keys are masked wherever a config is shown or saved."""

from __future__ import annotations

import pytest
import yaml

from pipelines.explore import main as explore_main
from schemas.config import flatten, load_config
from schemas.secrets import is_secret_key, mask_text, mask_tree

SECRET = "hunter2-s3cret"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"postgresql+psycopg://rft:{SECRET}@db:5432/x", "postgresql+psycopg://rft:***@db:5432/x"),
        (f"cannot use https://u:{SECRET}@h/api: refused", "cannot use https://u:***@h/api: refused"),
        ("http://host:5000/path", "http://host:5000/path"),  # a port is no password
        ("postgresql://u:${oc.env:PGPASS}@db/x", "postgresql://u:${oc.env:PGPASS}@db/x"),  # a reference
    ],
)
def test_url_passwords_are_masked_in_text(text, shown):
    assert mask_text(text) == shown


def test_secret_named_keys_are_masked_and_others_kept():
    names = ("api_key", "hf_token", "DB_PASSWORD", "max_tokens", "stop_token_ids")
    assert [is_secret_key(k) for k in names] == [True, True, True, False, False]
    tree = {"api_key": SECRET, "token": None, "secret": "${oc.env:S}", "nested": [{"password": 7}], "n": 3}
    assert mask_tree(tree) == {
        "api_key": "***", "token": None, "secret": "${oc.env:S}", "nested": [{"password": "***"}], "n": 3
    }  # fmt: skip


def test_a_config_shows_and_saves_no_secret(tmp_path, capsys):
    overrides = [
        "buffer.trainer_input.experience_buffer.storage_type=sql",
        f"buffer.trainer_input.experience_buffer.path=postgresql+psycopg://rft:{SECRET}@127.0.0.1:1/rft",
        f"explorer.rollout_model.api_key={SECRET}",
    ]
    cfg = load_config(None, overrides)
    assert SECRET not in yaml.safe_dump(cfg.public_dump()) and SECRET not in str(flatten(cfg))
    assert load_config(None, overrides).explorer.rollout_model.api_key == SECRET  # the run has the values
    args = [a for o in overrides for a in ("--set", o)]
    assert explore_main([*args, "--dry-run"]) == 2  # the store cannot be reached: refused, masked
    out, err = capsys.readouterr()
    assert "rft:***@" in err and SECRET not in out + err
