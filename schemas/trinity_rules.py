"""The kinds of rule in the Trinity-RFT key table (`schemas.trinity_keys`), and the walk that applies them.

A Trinity config is held to the standard Trinity holds it to: its structured schema refuses a key it lacks, so
the walk refuses any key the table does not list, naming it and the nearest listed key. Every listed key is
mapped (to an rftflow key, through a named transform), ignored (with a notice giving the reason) or refused
(when its value asks for something rftflow cannot do). The same rules render the docs page, so each rule
carries its own words.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.errors import InputError

# (value, translation, Trinity key) -> the rftflow value, or None to put nothing
Transform = Callable[[Any, "Translation", str], Any]
# (translation, Trinity key) -> the value an absent key stands for
Default = Callable[["Translation", str], Any]


@dataclass(frozen=True)
class Truthy:
    """Refuse any value but an empty or false one (Trinity's defaults for these keys)."""

    text: str = "set"

    def __call__(self, value: Any) -> bool:
        return bool(value)


@dataclass(frozen=True)
class Given:
    """Refuse any value at all (a zero or false one included): Trinity's default for these keys is null."""

    text: str = "given"

    def __call__(self, value: Any) -> bool:
        return value is not None


@dataclass(frozen=True)
class Differs:
    """Refuse any value but Trinity's default, which is what rftflow does too."""

    default: Any

    @property
    def text(self) -> str:
        return f"not `{self.default}`"

    def __call__(self, value: Any) -> bool:
        return value is not None and value != self.default


@dataclass(frozen=True)
class Enabled:
    """Refuse a sub-config whose `enable` is on (or a bare value given in its place)."""

    text: str = "enabled"

    def __call__(self, value: Any) -> bool:
        return bool(value.get("enable")) if isinstance(value, dict) else bool(value)


@dataclass(frozen=True)
class HasAny:
    """Refuse a sub-config that sets any of these keys."""

    keys: tuple[str, ...]

    @property
    def text(self) -> str:
        return "with " + " or ".join(f"`{k}`" for k in self.keys)

    def __call__(self, value: Any) -> bool:
        return isinstance(value, dict) and any(value.get(k) for k in self.keys)


Predicate = Truthy | Given | Differs | Enabled | HasAny


@dataclass(frozen=True)
class Map:
    """A key with an rftflow meaning: its value (or `default` when absent, or with `always` None) goes through
    `transform` to `target`, an rftflow key under the section's; an empty target means the transform acts on
    its own (a check, a notice). `note` says what the transform does, for the docs."""

    target: str
    note: str = ""
    transform: Transform | None = None
    default: Default | None = None
    always: bool = False


@dataclass(frozen=True)
class Read:
    """A key whose meaning another key's transform or default carries (`target` says where it lands)."""

    target: str
    note: str = ""


@dataclass(frozen=True)
class Ignore:
    """A key with no effect on what the explorer does here; `keys`, where given, are the only keys Trinity
    knows inside it, so a misspelt one is still refused."""

    reason: str
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refuse:
    """A key whose value asks for what rftflow cannot do (`when` says which values); any other value is
    ignored with `otherwise` as its reason (no notice without one). `keys` as for `Ignore`."""

    reason: str
    when: Predicate = Truthy()
    otherwise: str = ""
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """A Trinity dataclass: its keys, in the order they are applied, under rftflow's `into` (relative to the
    enclosing section's). It is walked even when absent, so its keys' defaults apply."""

    keys: dict[str, Rule] = field(default_factory=dict)
    into: str = ""


@dataclass(frozen=True)
class Each:
    """A list of one Trinity dataclass, item i going to rftflow's `into`.i."""

    item: Section
    into: str


Rule = Map | Read | Ignore | Refuse | Section | Each


def ignored(keys: tuple[str, ...], reason: str) -> dict[str, Rule]:
    """Several keys ignored for one reason."""
    return {key: Ignore(reason) for key in keys}


def join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


class Translation:
    """One Trinity config (already interpolated) becoming rftflow's: the native tree, and a notice per key
    that was ignored or changed."""

    def __init__(self, tree: dict[str, Any], source: str):
        self.src = tree
        self.source = source
        self.out: dict[str, Any] = {}
        self.notices: list[str] = []

    def get(self, dotted: str, default: Any = None) -> Any:
        """The source value at a dotted Trinity key (list items by index), or `default`."""
        node: Any = self.src
        for part in dotted.split("."):
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return default
        return default if node is None else node

    def put(self, dotted: str, value: Any) -> None:
        """Set an rftflow key; a numeric part indexes a list, grown as needed."""
        node: Any = self.out
        parts = dotted.split(".")
        for part, after in zip(parts, parts[1:], strict=False):
            child: Any = [] if after.isdigit() else {}
            if isinstance(node, list):
                while len(node) <= int(part):
                    node.append(type(child)())
                node = node[int(part)]
            else:
                node = node.setdefault(part, child)
        if isinstance(node, list):
            while len(node) <= int(parts[-1]):
                node.append(None)
            node[int(parts[-1])] = value
        else:
            node[parts[-1]] = value

    def refuse(self, key: str, why: str) -> None:
        raise InputError(f"Trinity key {key}: {why}", file=self.source, field=key)

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def check_keys(self, node: Any, known: Any, where: str) -> None:
        """Refuse a key Trinity-RFT 0.6 does not know, with the nearest one it does."""
        if not isinstance(node, dict):
            return
        for key in node:
            if key not in known:
                close = difflib.get_close_matches(str(key), list(known), n=1)
                hint = f" (did you mean {join(where, close[0])}?)" if close else ""
                self.refuse(join(where, str(key)), f"not a key of Trinity-RFT 0.6's config{hint}")

    def walk(self, section: Section, node: Any, where: str, into: str) -> None:
        if node is None:
            node = {}
        if not isinstance(node, dict):
            self.refuse(where, f"expected a mapping of keys, got {type(node).__name__}")
        self.check_keys(node, section.keys, where)
        for key, rule in section.keys.items():
            self.apply(rule, node, key, join(where, key), join(into, section.into))

    def apply(self, rule: Rule, node: dict[str, Any], key: str, where: str, into: str) -> None:
        value = node.get(key)
        if isinstance(rule, Section):
            self.walk(rule, value, where, into)
        elif isinstance(rule, Each):
            if value is not None and not isinstance(value, list):
                self.refuse(where, f"expected a list, got {type(value).__name__}")
            for i, item in enumerate(value or []):
                self.walk(rule.item, item, f"{where}.{i}", join(into, rule.into, str(i)))
        elif isinstance(rule, Map):
            self.apply_map(rule, value, where, into)
        elif isinstance(rule, Ignore) and key in node:
            if rule.keys:
                self.check_keys(value, rule.keys, where)
            self.notice(f"{where}: ignored ({rule.reason})")
        elif isinstance(rule, Refuse) and key in node:
            if rule.when(value):
                self.refuse(where, rule.reason)
            if rule.keys:
                self.check_keys(value, rule.keys, where)
            if rule.otherwise:
                self.notice(f"{where}: ignored ({rule.otherwise})")

    def apply_map(self, rule: Map, value: Any, where: str, into: str) -> None:
        if value is None and rule.default is not None:
            value = rule.default(self, where)
        if value is None and not rule.always:
            return
        if rule.transform is not None:
            value = rule.transform(value, self, where)
        if value is not None and rule.target:
            self.put(join(into, rule.target), value)
