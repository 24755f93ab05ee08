"""The plugin API: a plugin written against each documented import loads, as `--plugin-dir` loads it.

The README's and docs/workflows.md's examples import from `operators.workflows` and load silently; plugins
written against the earlier homes (`operators.rewards`, `operators.rollout.rewards`,
`operators.workflows.registry`, `operators.workflows.math`, `operators.ops`) load too, each with a
DeprecationWarning that names the new import.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

import operators.workflows as api
from operators.ops import registry as op_registry
from operators.rollout import reward_registry
from operators.rollout.plugins import load_plugins
from operators.workflows import base

ROOT = Path(__file__).resolve().parents[2]
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)

OLD_IMPORTS = {
    "operators.rewards": """
from operators.rewards import register_reward

@register_reward("old_exact")
def exact(response, truth):
    return {"reward": float(response == truth)}
""",
    "operators.rollout.rewards": """
from operators.rollout.rewards import register_reward

@register_reward("old_exact")
def exact(response, truth):
    return {"reward": float(response == truth)}
""",
    "operators.workflows.registry": """
from operators.workflows.registry import WorkflowBase, register_workflow

@register_workflow("old_flow")
class OldFlow(WorkflowBase):
    async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        return []
""",
    "operators.workflows.math": """
from operators.workflows.math import MathWorkflow
from operators.workflows import register_workflow

@register_workflow("old_flow")
class OldFlow(MathWorkflow):
    default_reward_fn = "format"
""",
    "operators.ops": """
from operators.ops import ExperienceOpBase, OpArgs, register_op

@register_op("old_op")
class OldOp(ExperienceOpBase):
    class Args(OpArgs):
        keep: bool = True

    def __call__(self, experiences):
        return experiences
""",
}


pytestmark = pytest.mark.usefixtures("scratch_registries")  # tests/unit/conftest.py


def registered() -> set[str]:
    return set(base.WORKFLOWS) | set(reward_registry.REWARD_FNS) | set(op_registry.OPS)


def load(tmp_path: Path, source: str) -> tuple[set[str], list[warnings.WarningMessage]]:
    """Load `source` as the one file of a plugin dir: the names it registered, and the warnings it raised."""
    (tmp_path / "plugin.py").write_text(source)
    before = registered()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_plugins(tmp_path)
    return registered() - before, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def documented_plugins() -> list[tuple[str, str]]:
    """The Python examples of the README and docs/workflows.md that are plugins (they register something)."""
    found = []
    for page in (ROOT / "README.md", ROOT / "docs" / "workflows.md"):
        for index, block in enumerate(PYTHON_BLOCK.findall(page.read_text())):
            if "from operators.workflows import" in block and "@register_" in block:
                found.append((f"{page.name}#{index}", block))
    return found


def test_the_docs_have_plugin_examples_and_they_import_only_the_plugin_api():
    examples = documented_plugins()
    assert len(examples) >= 4  # README's reward+workflow, the docs' copy of it, the op, the env, the agent
    for name, block in examples:
        homes = set(re.findall(r"^from (operators[\w.]*) import", block, re.MULTILINE))
        assert homes == {"operators.workflows"}, (name, homes)


@pytest.mark.parametrize(("name", "source"), documented_plugins(), ids=lambda v: v if "#" in v else "")
def test_each_documented_plugin_loads_without_a_warning(tmp_path: Path, name: str, source: str):
    names, deprecations = load(tmp_path, source)
    assert names, f"{name} registered nothing"
    assert not deprecations, [str(w.message) for w in deprecations]


@pytest.mark.parametrize("old_home", sorted(OLD_IMPORTS))
def test_a_plugin_on_an_old_import_loads_with_a_warning_naming_the_new_one(tmp_path: Path, old_home: str):
    names, deprecations = load(tmp_path, OLD_IMPORTS[old_home])
    assert names & {"old_exact", "old_flow", "old_op"}
    messages = [str(w.message) for w in deprecations]
    assert messages and all(f"from {old_home} import" in m for m in messages), messages
    assert all("use `from operators.workflows import" in m for m in messages), messages


def test_the_old_homes_hand_out_the_same_objects():
    from operators.rollout import rewards

    with pytest.warns(DeprecationWarning, match="operators.workflows import register_reward"):
        from operators.rewards import register_reward
    assert register_reward is api.register_reward
    with pytest.warns(DeprecationWarning):
        assert rewards.get_reward_fn is api.get_reward_fn
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = rewards.nothing


def test_every_exported_name_exists():
    assert all(hasattr(api, name) for name in api.__all__)
    exported = set(api.__all__)
    assert {"register_workflow", "register_reward", "register_op", "EnvWorkflow", "AgentWorkflow"} <= exported
    assert {"SingleTurnWorkflow", "MalformedAction", "Task", "Experience", "EngineClient"} <= exported
