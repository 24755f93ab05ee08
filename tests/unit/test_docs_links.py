"""The README and docs/ have no dead link, and the README's shell commands name things that exist.

Every relative link (and its `#anchor`, by GitHub's heading slugs) in README.md and docs/*.md must resolve,
and every command in a fenced `bash` block of the README must name a real Make target, a module
(`python -m X`) or a file (`python FILE`): a newcomer copies those lines first.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(```|~~~)(\w*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
REPO_FOLDERS = (
    "benchmarks/",
    "docs/",
    "examples/",
    "notebooks/",
    "operators/",
    "pipelines/",
    "schemas/",
    "tests/",
)


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a link or heading inside one is code, not markdown)."""
    lines, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match and fence is None:
            fence = match.group(2)
        elif match and line.strip().startswith(fence or "\0"):
            fence = None
        elif fence is None:
            lines.append(line)
    return lines


def bash_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced block tagged `bash`."""
    blocks, current, fence = [], None, None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match and fence is None:
            fence, current = match.group(2), ([] if match.group(3) == "bash" else None)
        elif match and line.strip().startswith(fence or "\0"):
            if current is not None:
                blocks.append(current)
            fence, current = None, None
        elif current is not None:
            current.append(line)
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation gone, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor the page's headings give, numbered -1, -2, ... for repeats as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The page's link targets that point into the repository (not http:, mailto:, ...)."""
    targets = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                targets.append(target)
    return targets


def dead_link(page: Path, target: str) -> str | None:
    """Why `target` (as written in `page`) does not resolve, or None."""
    path_part, _, anchor = target.partition("#")
    resolved = (page.parent / path_part).resolve() if path_part else page
    if not resolved.exists():
        return f"{page.name}: {target}: no file {path_part}"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{page.name}: {target}: no heading gives #{anchor}"
    return None


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z][\w-]*)\s*:(?!=)", line)
        if match:
            targets.add(match.group(1))
    return targets


def commands(block: list[str]) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped, `&&` and `;` split apart."""
    joined, pending = [], ""
    for line in block:
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        joined.append(pending)
        pending = ""
    result = []
    for line in joined + ([pending] if pending else []):
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in words + [";"]:
            if word in ("&&", ";", "||"):
                if command:
                    result.append(shlex.join(command))
                command = []
            else:
                command.append(word)
    return result


def command_problem(command: str, targets: set[str]) -> str | None:
    """Why `command` names nothing real, or None. Variables (`EXTRAS=gpu`) before it are skipped."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    if not words:
        return f"{command!r}: no command"
    for word in words:
        if word.startswith(REPO_FOLDERS) and not (ROOT / word.split("=", 1)[-1]).exists():
            return f"{command!r}: no file {word}"
    program, rest = words[0], words[1:]
    if program == "make":
        named = [word for word in rest if not word.startswith("-") and "=" not in word]
        missing = [word for word in named if word not in targets]
        return f"{command!r}: no Make target {missing}" if missing or not named else None
    if program in ("python", "python3"):
        if rest[:1] == ["-m"] and len(rest) > 1:
            module = ROOT / rest[1].replace(".", "/")
            found = module.with_suffix(".py").exists() or (module / "__init__.py").exists()
            return None if found else f"{command!r}: no module {rest[1]}"
        if rest and (ROOT / rest[0]).is_file():
            return None
        return f"{command!r}: names no module or file"
    return f"{command!r}: not a make or python command"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    problems = [problem for target in relative_links(page) if (problem := dead_link(page, target))]
    assert not problems, "\n".join(problems)


def test_every_readme_bash_command_names_a_real_target_module_or_file():
    targets = make_targets()
    blocks = bash_blocks((ROOT / "README.md").read_text())
    found = [command for block in blocks for command in commands(block)]
    assert len(found) >= 3  # the two commands and the demo at least
    problems = [problem for command in found if (problem := command_problem(command, targets))]
    assert not problems, "\n".join(problems)


def test_slugs_follow_github_rules():
    assert slug("Steps, evals and resume") == "steps-evals-and-resume"
    assert slug("`python -m pipelines.explore`") == "python--m-pipelinesexplore"
    assert slug("The straggler tail: admission, over-rollout, dynamic timeout") == (
        "the-straggler-tail-admission-over-rollout-dynamic-timeout"
    )
    assert slug("`tool_math` and bringing your own agent") == "tool_math-and-bringing-your-own-agent"


def test_the_checks_catch_a_dead_link_a_bad_anchor_and_a_made_up_command(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A section\n\n[ok](#a-section) [gone](missing.md) [bad](#nowhere)\n")
    problems = [dead_link(page, target) for target in relative_links(page)]
    assert problems[0] is None and "no file missing.md" in str(problems[1]) and "#nowhere" in str(problems[2])
    targets = make_targets()
    assert command_problem("make explore", targets) is None
    assert command_problem("EXTRAS=gpu make explore", targets) is None
    assert "no Make target" in str(command_problem("make nosuch", targets))
    assert command_problem("python -m pipelines.explore --steps 2", targets) is None
    assert "no module" in str(command_problem("python -m pipelines.nosuch", targets))
    assert "no file" in str(command_problem("python -m pipelines.explore --config pipelines/x.yaml", targets))
    assert "not a make or python" in str(command_problem("curl example.com", targets))
    block = ["make a \\", "  B=1  # note", "python x.py && make b"]
    assert commands(block) == ["make a B=1", "python x.py", "make b"]
