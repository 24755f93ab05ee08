"""Architecture rules, checked statically: every .py under schemas/, operators/ and pipelines/ is parsed
with `ast` (nothing is imported), and each rule lists all of its offenders as file:line.

Layers, bottom to top: schemas <- operators <- pipelines. Benchmarks and tests are not checked.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"schemas": 0, "operators": 1, "pipelines": 2}  # a package may import only its own layer or lower
MAX_LINES = 400

# Third-party modules heavy enough that a function may import them on purpose, so that the modules around it
# import fast and without them (a driver without Ray or vLLM; the CLI's --help; Ray Data workers that never
# touch the engine). Decided by `python -X importtime -c "import X"` (best of 5, this machine): heavy is about
# 0.3 s or more. vllm 5.5 s, mlflow 1.7 s, torch 1.4 s, safetensors.torch 1.2 s (it imports torch),
# transformers 1.1 s, ray 0.44 s (ray.data 1.1 s), matplotlib.figure 0.44 s (matplotlib 0.16 s), math_verify
# 0.41 s, openai 0.86 s (only agent workflows use it), uvicorn 0.13 s (only an engine serving the OpenAI API;
# it pulls in its HTTP stack). Light, so imported at module level: tqdm 54 ms, yaml 17 ms, tokenizers 9 ms,
# safetensors 1 ms (its numpy/torch backends are separate modules), and pyarrow 0.12-0.15 s, sqlalchemy
# 0.25 s, which every driver module needs anyway. A name covers its submodules.
HEAVY = frozenset(
    {
        "ray",
        "vllm",
        "torch",
        "transformers",
        "mlflow",
        "safetensors.torch",
        "matplotlib",
        "math_verify",
        "openai",
        "uvicorn",
        "datasets",  # 0.6 s
        "reasoning_gym",  # about 1 s, and optional: the `tasks` extra
        "peft",  # imports torch and transformers, and optional: the `lora` extra
    }
)

# The engines' weight-loading methods: only the fleet calls them, so every load goes through its checks.
WEIGHT_LOADERS = frozenset({"load_checkpoint", "load_state_dict", "receive_weights", "open_weight_group"})
WEIGHT_LOADER_MODULE = "pipelines.control.fleet"


@dataclass(frozen=True)
class Import:
    line: int
    end_line: int
    target: str  # the module it loads: `from pkg import name` is pkg.name when that is a module, else pkg
    names: tuple[str, ...]  # the names a `from` import takes; () for `import x`
    deferred: bool  # inside a function body
    type_checking: bool  # inside `if TYPE_CHECKING:`


@dataclass
class Module:
    name: str
    path: Path
    source: str
    tree: ast.Module
    imports: list[Import] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> the project module it is bound to

    @property
    def rel(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    def at(self, line: int) -> str:
        return f"{self.rel}:{line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_project(name: str) -> bool:
    return name.split(".")[0] in LAYERS


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_heavy(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HEAVY)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def walk_imports(nodes: list[ast.AST], deferred: bool, type_checking: bool):
    """(import node, deferred, type_checking) for every import statement under `nodes`."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, deferred, type_checking
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            yield from walk_imports(node.body, deferred, True)
            yield from walk_imports(node.orelse, deferred, type_checking)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from walk_imports(list(ast.iter_child_nodes(node)), True, type_checking)
        else:
            yield from walk_imports(list(ast.iter_child_nodes(node)), deferred, type_checking)


def from_base(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


@functools.cache
def parse_all() -> tuple[dict[str, Module], tuple[str, ...]]:
    """The project's modules by name, and the files that do not parse (left out of every other rule)."""
    paths = sorted(p for top in LAYERS for p in (ROOT / top).rglob("*.py"))
    modules, broken = {}, []
    for path in paths:
        source = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(source, str(path))
        except SyntaxError as exc:
            broken.append(f"{path.relative_to(ROOT).as_posix()}:{exc.lineno}: {exc.msg}")
            continue
        modules[module_name(path)] = Module(module_name(path), path, source, tree)
    for module in modules.values():
        for node, deferred, type_checking in walk_imports(module.tree.body, False, False):
            flags = {"line": node.lineno, "end_line": node.end_lineno, "deferred": deferred}
            flags["type_checking"] = type_checking
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module.imports.append(Import(target=alias.name, names=(), **flags))
                    if alias.asname:
                        module.aliases[alias.asname] = alias.name
                    else:
                        module.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
                continue
            base = from_base(module, node)
            by_target: dict[str, list[str]] = {}
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                if sub in modules:
                    module.aliases[alias.asname or alias.name] = sub
                by_target.setdefault(sub if sub in modules else base, []).append(alias.name)
            for target, names in by_target.items():
                module.imports.append(Import(target=target, names=tuple(names), **flags))
        module.aliases = {k: v for k, v in module.aliases.items() if is_project(v)}
    return modules, tuple(broken)


def project() -> dict[str, Module]:
    return parse_all()[0]


def report(rule: str, offenders: list[str]) -> str:
    return f"{rule}: {len(offenders)} offender(s)\n  " + "\n  ".join(offenders)


def test_every_module_parses():
    broken = list(parse_all()[1])
    assert not broken, report("modules that do not parse (the other rules skip them)", broken)


def test_the_checker_sees_the_project():
    modules = project()
    assert {"schemas.config", "operators.rollout.runner", "pipelines.control.fleet"} <= set(modules)
    runner = {i.target for i in modules["operators.rollout.runner"].imports}
    assert {"operators.workflows.base", "schemas.task"} <= runner


# -- a. no import cycles -------------------------------------------------------------------------------------


def import_graph() -> dict[str, dict[str, tuple[Module, Import]]]:
    """module -> {imported project module: (importer, its first import of it)}; TYPE_CHECKING ones aside."""
    modules = project()
    graph: dict[str, dict[str, tuple[Module, Import]]] = {name: {} for name in modules}
    for name, module in modules.items():
        for imp in module.imports:
            if imp.target in modules and imp.target != name and not imp.type_checking:
                graph[name].setdefault(imp.target, (module, imp))
    return graph


def strongly_connected(graph: dict[str, dict]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [c for c in found if len(c) > 1]


def shortest_path(graph: dict[str, dict], start: str, goal: str, within: set[str]) -> list[str]:
    came_from = {start: start}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        if v == goal:
            path = [v]
            while path[-1] != start:
                path.append(came_from[path[-1]])
            return path[::-1]
        for w in sorted(graph[v]):
            if w in within and w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"no path {start} -> {goal} in a strongly connected component")


def import_cycles() -> list[list[str]]:
    """A shortest cycle through each import edge on a cycle; each cycle once, from its smallest name."""
    graph = import_graph()
    cycles = set()
    for component in strongly_connected(graph):
        for u in sorted(component):
            for v in graph[u]:
                if v in component:
                    ring = [u, *shortest_path(graph, v, u, component)[:-1]]
                    first = ring.index(min(ring))
                    cycles.add(tuple(ring[first:] + ring[:first]))
    return [list(c) for c in sorted(cycles, key=lambda c: (len(c), c))]


def test_no_import_cycles():
    graph = import_graph()
    offenders = []
    for ring in import_cycles():
        hops = []
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            module, imp = graph[a][b]
            hops.append(f"\n      {module.at(imp.line)} imports {b}{' (in a function)' * imp.deferred}")
        offenders.append(" -> ".join(ring + ring[:1]) + "".join(hops))
    assert not offenders, report(
        "import cycles (each as a chain, then the import making each hop)", offenders
    )


# -- b. no upward imports ------------------------------------------------------------------------------------


def test_no_upward_imports():
    offenders = []
    for module in project().values():
        layer = module.name.split(".")[0]
        for imp in module.imports:
            top = imp.target.split(".")[0]
            if top in LAYERS and LAYERS[top] > LAYERS[layer]:
                offenders.append(f"{module.at(imp.line)}: {layer} imports {imp.target}")
    assert not offenders, report("upward imports (schemas <- operators <- pipelines)", offenders)


# -- c. module size ------------------------------------------------------------------------------------------


def test_no_module_over_400_lines():
    offenders = [
        f"{m.rel}:{len(m.source.splitlines())}: {len(m.source.splitlines())} lines"
        for m in project().values()
        if len(m.source.splitlines()) > MAX_LINES
    ]
    assert not offenders, report(f"modules over {MAX_LINES} lines (split by responsibility)", offenders)


# -- c2. `# fmt: skip` only on a literal table -------------------------------------------------------------
# Kept by hand, a table of literals may read better than the formatter's one item a line; on code, the marker
# only saves lines the formatter would spend, and hides what ruff would otherwise show.

FMT_SKIP = "# fmt: skip"


def is_literal(node: ast.expr) -> bool:
    """A constant (a signed number too), or a list, tuple or dict made only of those."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, ast.List | ast.Tuple):
        return all(is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and is_literal(k) for k in node.keys) and all(map(is_literal, node.values))
    return False


def literal_table(node: ast.stmt) -> bool:
    """An assignment whose value is a list, tuple or dict of literals."""
    value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
    return isinstance(value, ast.List | ast.Tuple | ast.Dict) and is_literal(value)


def fmt_skip_offenders(source: str, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, why) for each `# fmt: skip` that is not at the end of an assignment of a literal table."""
    ending: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            held = ending.get(node.end_lineno)
            if held is None or node.lineno >= held.lineno:  # the innermost statement ending on that line
                ending[node.end_lineno] = node
    offenders = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT or FMT_SKIP not in tok.string:
            continue
        line = tok.start[0]
        statement = ending.get(line)
        if statement is None:
            offenders.append((line, "not at the end of a statement"))
        elif not literal_table(statement):
            assigns = isinstance(statement, ast.Assign | ast.AnnAssign)
            kind = type(statement).__name__
            offenders.append((line, "a value not all literals" if assigns else f"on a statement ({kind})"))
    return offenders


def test_the_fmt_skip_rule_tells_a_literal_table_from_code():
    def offenders(source: str) -> list[int]:
        return [line for line, _ in fmt_skip_offenders(source, ast.parse(source))]

    tables = 'A = ("a", "b",\n     "c")  # fmt: skip\nB: dict = {"x": [1, -2.5], "y": None}  # fmt: skip\n'
    assert offenders(tables) == []
    code = (
        "f(1,\n  2)  # fmt: skip\n"  # a call
        "C = [x for x in y]  # fmt: skip\n"  # a comprehension
        'D = ("a",\n     name)  # fmt: skip\n'  # a name among the literals
        'E += ("a",)  # fmt: skip\n'  # a table continued, to save lines
        "g(3,  # fmt: skip\n  4)\n"  # inside a statement
    )
    assert offenders(code) == [2, 3, 5, 6, 7]


def test_fmt_skip_only_on_a_literal_table():
    offenders = [
        f"{m.at(line)}: {why}"
        for m in project().values()
        for line, why in fmt_skip_offenders(m.source, m.tree)
    ]
    assert not offenders, report(
        f"`{FMT_SKIP}` outside an assignment of a list, tuple or dict of literals (let ruff format it)",
        offenders,
    )


# -- d. private names stay in their module -------------------------------------------------------------------


def module_attribute(module: Module, node: ast.Attribute) -> tuple[str, str] | None:
    """(project module, attribute) when `node` is `<alias>[.sub...].attr` with alias an imported module."""
    chain = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name) or value.id not in module.aliases:
        return None
    chain.reverse()
    target = module.aliases[value.id]
    modules = project()
    for i, attr in enumerate(chain):
        if i == len(chain) - 1 or f"{target}.{attr}" not in modules:
            return (target, attr) if i == len(chain) - 1 else None
        target = f"{target}.{attr}"
    return None


def test_no_private_names_across_modules():
    offenders = []
    for module in project().values():
        for imp in module.imports:
            for name in imp.names:
                if is_project(imp.target) and imp.target != module.name and is_private(name):
                    offenders.append(f"{module.at(imp.line)}: imports {name} from {imp.target}")
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr):
                found = module_attribute(module, node)
                if found and found[0] != module.name:
                    offenders.append(f"{module.at(node.lineno)}: uses {found[0]}.{found[1]}")
    assert not offenders, report("private names used outside their module (make them public)", offenders)


# -- e. function-level imports -------------------------------------------------------------------------------


def trailing_comments(source: str) -> dict[int, str]:
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.line[: tok.start[1]].strip():
            comments[tok.start[0]] = tok.string
    return comments


def test_function_level_imports_are_heavy_and_marked_deferred():
    offenders = []
    for module in project().values():
        comments = trailing_comments(module.source)
        for imp in module.imports:
            if not imp.deferred or imp.type_checking:
                continue
            where = f"{module.at(imp.line)}: {imp.target}"
            marked = any("deferred" in comments.get(n, "") for n in range(imp.line, imp.end_line + 1))
            if is_project(imp.target) and not marked:  # a project module that pulls in a heavy one may wait
                offenders.append(f"{where}: a project module; import it at module level (break any cycle)")
            elif is_project(imp.target):
                continue
            elif not is_heavy(imp.target):
                offenders.append(f"{where}: light (not in HEAVY); import it at module level")
            elif not any("deferred" in comments.get(n, "") for n in range(imp.line, imp.end_line + 1)):
                offenders.append(
                    f"{where}: heavy, but the line needs a trailing comment saying why it is deferred"
                )
    assert not offenders, report("function-level imports", offenders)


# -- f. one module loads weights into the engines ------------------------------------------------------------


def test_only_the_fleet_calls_the_engines_weight_loading_methods():
    calls: dict[str, list[str]] = {}
    for module in project().values():
        if module.name.split(".")[0] != "pipelines":
            continue
        for node in ast.walk(module.tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "remote"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in WEIGHT_LOADERS
            ):
                calls.setdefault(module.name, []).append(
                    f"{module.at(node.lineno)}: {node.value.attr}.remote"
                )
    offenders = [
        call for name, found in sorted(calls.items()) if name != WEIGHT_LOADER_MODULE for call in found
    ]
    if WEIGHT_LOADER_MODULE not in calls:
        offenders.append(f"{WEIGHT_LOADER_MODULE} makes none of these calls; it should be the one that does")
    rule = f"engine weight loading ({', '.join(sorted(WEIGHT_LOADERS))}) outside {WEIGHT_LOADER_MODULE}"
    assert not offenders, report(rule, offenders)
