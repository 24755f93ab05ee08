"""Secrets kept out of everything rftflow shows or saves: the console, logs, config.yaml and MLflow params.

Two kinds are masked: the password of a URL (`postgresql+psycopg://user:secret@host/db` is shown as
`user:***@`), and the value of any key whose name says it is a secret (`api_key`, `password`, `token`,
`secret`, or a name ending in one of them). A `${oc.env:NAME}` reference is left as it is: it names where the
value is, not the value (`schemas.interpolation`), and it is the way to give a secret in a config file.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
SECRET_NAMES = ("api_key", "apikey", "password", "passwd", "token", "secret")
# scheme://user:password@ : the password is anything up to the `@`, unless it is an environment reference
URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?!\$\{oc\.env:)[^@\s/]+@")
ENV_REFERENCE = re.compile(r"^\$\{oc\.env:[^}]*\}$")


def is_secret_key(name: str) -> bool:
    """`api_key`, `hf_token`, `db_password`...; not `max_tokens` or `stop_token_ids`."""
    lowered = str(name).lower()
    return any(lowered == s or lowered.endswith(("_" + s, "-" + s)) for s in SECRET_NAMES)


def mask_text(text: str) -> str:
    """`text` with the password of every URL in it masked."""
    return URL_PASSWORD.sub(rf"\1{MASK}@", text)


def mask_tree(tree: Any) -> Any:
    """A tree of config values with every URL password, and every secret-named key's value, masked."""
    if isinstance(tree, dict):
        return {k: mask_value(v) if is_secret_key(k) else mask_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [mask_tree(v) for v in tree]
    return mask_text(tree) if isinstance(tree, str) else tree


def mask_value(value: Any) -> Any:
    if value is None or value == "" or (isinstance(value, str) and ENV_REFERENCE.match(value)):
        return value
    return MASK
