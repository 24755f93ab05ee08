"""What every config section shares: strict parsing, the sane upper bounds, paths that must be given, and
where the bundled assets the defaults name live."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

# The bundled tiny models and tasksets, which the defaults point at.
ASSETS = Path(__file__).resolve().parent.parent / "pipelines" / "assets"
# Upper bounds that no real run comes near, so a typo fails here and not in vLLM, a loop or a timer.
MAX_TOKENS = 2**24  # 16M tokens: beyond any model's context
MAX_SECONDS = 7 * 24 * 3600.0  # a week, for every timeout and interval (threading refuses huge timeouts)
MAX_INT32 = 2**31 - 1


class Strict(BaseModel):
    # Numbers given for text fields (`--set name=2024`) are kept as text, as a user would expect.
    # No float field takes nan or inf (`--set ...temperature=.nan`): every bound is meaningless for them.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, coerce_numbers_to_str=True, allow_inf_nan=False
    )


def given_path(value: Any) -> Any:
    """An empty path (`--set key=`) would silently be the working directory; a NUL character no OS takes."""
    if isinstance(value, str) and (not value.strip() or "\0" in value):
        raise ValueError("an empty path, or one with a NUL character: give a real path, or leave the key out")
    return value


GivenPath = Annotated[Path, BeforeValidator(given_path)]
