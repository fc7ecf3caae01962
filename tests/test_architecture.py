"""The package's architecture, read from its imports (ast, nothing is imported).

``course_utils`` is cut into subpackages by role, and imports flow one way:

    checks  <-  theory  <-  runtime  <-  impl  <-  harness  <-  labs  <-  course

A module may import its own subpackage and the layers to its left, never one to its
right; ``theory`` (arithmetic models) imports no ``torch.distributed`` at all, and draws
nothing (its figures are ``course.plots``). A module sits with its users: the grading engine
in ``labs`` (``labs.hangs`` grades an exercise, ``course.exercises`` the rest), the widget
display helpers in ``course``, the only layer that shows widgets. No module is longer than
:data:`MAX_LINES` lines but those of :data:`TOO_LONG`, a list that can only shrink. The
top-level modules other than ``checks`` (``memory``, ``comm``, ``launch``,
``experiments``, ``config``: the names of the course's contracts) are thin re-exports
kept at the import paths code outside the package uses: nothing inside the package
imports them, and nothing the course writes cites them (one name for each thing). No module
imports a private name (``_x``) from another subpackage, and no import cycle exists,
counting imports inside functions too.
"""
import ast
from pathlib import Path

import pytest

import course_utils

PKG = Path(course_utils.__file__).parent
LAYERS = ["checks", "theory", "runtime", "impl", "harness", "labs", "course"]
SHIMS = {"memory", "comm", "launch", "experiments", "config"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(("course_utils",) + parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path):
    """(imported module, imported names, line) for every import in the file, resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            # `from pkg import module`: the module is what is imported
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            if subs:
                for sub in subs:
                    yield sub, [], node.lineno
                rest = [n for n in names if f"{target}.{n}" not in MODULES]
                if rest:
                    yield target, rest, node.lineno
            else:
                yield target, names, node.lineno


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None                                  # the package itself
    return parts[1] if parts[1] in LAYERS else ("shim" if parts[1] in SHIMS else parts[1])


EDGES = [(src, dst, names, line) for src, path in MODULES.items()
         for dst, names, line in _imports(src, path) if dst.startswith("course_utils")]


def test_the_tree_is_the_documented_one():
    subpackages = sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert subpackages == sorted(LAYERS[1:])
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")
    assert top == sorted(SHIMS | {"checks"})


def _upward(edges) -> list[str]:
    """The edges of ``edges`` ((src, dst, names, line)) that break the one-way rule."""
    wrong = []
    for src, dst, _, line in edges:
        a, b = _layer(src), _layer(dst)
        if a is None or a == "shim":                 # the package __init__ and the shims may import anything
            continue
        if b == "shim" or b is None and dst != "course_utils":
            wrong.append(f"{src}:{line} imports {dst} (a re-export for code outside the package)")
        elif b in LAYERS and LAYERS.index(b) > LAYERS.index(a):
            wrong.append(f"{src}:{line} ({a}) imports {dst} ({b}), a layer above it")
    return wrong


def test_imports_flow_one_way():
    wrong = _upward(EDGES)
    assert not wrong, "\n".join(wrong)


def test_theory_imports_no_distributed_code():
    wrong = [f"{src}:{line} imports {dst}" for src, path in MODULES.items() if _layer(src) == "theory"
             for dst, _, line in _imports(src, path) if dst.startswith("torch.distributed")]
    assert not wrong, "\n".join(wrong)


def test_every_import_inside_the_package_names_a_module_that_exists():
    """A module moved (``harness.grading`` to ``labs.grading``, say) leaves no import behind."""
    wrong = [f"{src}:{line} imports {dst}" for src, dst, _, line in EDGES if dst not in MODULES]
    assert not wrong, "\n".join(wrong)


def test_theory_draws_nothing():
    """No module under theory/ imports matplotlib, at its top or inside a function: a model's
    figure is drawn in ``course/plots.py`` from what the model returns."""
    wrong = [f"{src}:{line} imports {dst}" for src, path in MODULES.items() if _layer(src) == "theory"
             for dst, _, line in _imports(src, path) if dst.split(".")[0] == "matplotlib"]
    assert not wrong, "\n".join(wrong)


def test_only_course_shows_widgets():
    wrong = [f"{src}:{line} imports {dst}" for src, path in MODULES.items() if _layer(src) != "course"
             for dst, _, line in _imports(src, path) if dst.split(".")[0] == "ipywidgets"]
    assert not wrong, "\n".join(wrong)


#: module -> the layer it belongs in: the lowest layer among the modules that import it.
PLACED_WITH_USERS = {"course_utils.labs.grading": "labs", "course_utils.course.widgets": "course"}


@pytest.mark.parametrize("module, layer", sorted(PLACED_WITH_USERS.items()))
def test_a_module_used_by_one_layer_up_sits_with_its_users(module, layer):
    users = {src for src, dst, _, _ in EDGES if dst == module and src != module}
    assert module in MODULES and _layer(module) == layer
    assert users and min(LAYERS.index(_layer(u)) for u in users) == LAYERS.index(layer), sorted(users)


MAX_LINES = 700
#: Modules over MAX_LINES lines not split yet, with their length when listed: none today
#: (theory/planner.py, 1047 lines, became planner + plan_types + gpt2xl and course/plots).
#: Split a module rather than add it; an entry no longer over the limit must be removed.
TOO_LONG: dict[str, int] = {}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_longer_than_max_lines():
    over = {name: _lines(path) for name, path in MODULES.items() if _lines(path) > MAX_LINES}
    grown = [f"{name}: {n} lines (allowed: {TOO_LONG.get(name, MAX_LINES)})" for name, n in sorted(over.items())
             if n > TOO_LONG.get(name, MAX_LINES)]
    assert not grown, "split these modules (at most %d lines each):\n" % MAX_LINES + "\n".join(grown)
    stale = sorted(set(TOO_LONG) - set(over))
    assert not stale, f"{stale} are no longer over {MAX_LINES} lines: remove them from TOO_LONG"


def test_no_private_name_crosses_a_subpackage():
    wrong = [f"{src}:{line} imports {n} from {dst}" for src, dst, names, line in EDGES
             for n in names if n.startswith("_") and not n.startswith("__") and _layer(src) != _layer(dst)]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    graph: dict[str, set] = {m: set() for m in MODULES}
    for src, dst, _, _ in EDGES:
        if dst in graph and dst != src and dst != "course_utils":
            graph[src].add(dst)
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("bad", [
    ("course_utils.theory.memory", "course_utils.impl.zero"),
    ("course_utils.impl.zero", "course_utils.harness.experiments"),
    ("course_utils.harness.train", "course_utils.memory"),
])
def test_the_direction_check_would_catch_an_upward_import(bad):
    src, dst = bad
    assert len(_upward([(src, dst, [], 1)])) == 1
    assert _upward([(dst, "course_utils.checks", [], 1)]) == []    # downwards is allowed


FSDP2_PRIVATE = {"_training_state", "_all_gather_result", "_fsdp_param_group", "_fsdp_param_groups",
                 "_unsharded_param", "all_gather_outputs", "comm_ctx", "_cdata", "_execution_engine"}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def test_private_torch_apis_only_in_compat():
    """Every private torch name (a module or attribute starting with ``_`` under ``torch``,
    and FSDP2's private state) is reached through ``runtime/compat.py`` only."""
    wrong = []
    for name, path in MODULES.items():
        if name == "course_utils.runtime.compat":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                mods = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            for m in mods:
                if m.startswith("torch") and any(p.startswith("_") for p in m.split(".")):
                    wrong.append(f"{name}:{node.lineno} imports {m}")
            if isinstance(node, ast.Attribute):
                chain = _dotted(node)
                head = chain.split(".")[0]
                if node.attr in FSDP2_PRIVATE or (head in ("torch", "dist") and node.attr.startswith("_")
                                                  and not node.attr.startswith("__")):
                    wrong.append(f"{name}:{node.lineno} reads {chain or node.attr}")
        wrong += _private_library_reads(name, tree)
    assert not wrong, "\n".join(sorted(set(wrong)))


#: Private names of other libraries that are documented for use (os._exit: the way a
#: forked child leaves; sys._getframe).
DOCUMENTED_PRIVATE = {"os._exit", "sys._getframe"}


def _private_library_reads(name: str, tree) -> list[str]:
    """``module._x`` or ``getattr(module, "_x")`` on a module imported from outside the
    package (multiprocessing's resource tracker, say): only compat may."""
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update({(a.asname or a.name).split(".")[0]: a.name for a in node.names})
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("course_utils"):
            imported.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            base, attr = node.value.id, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            base, attr = node.args[0].id, node.args[1].value
        else:
            continue
        if (base in imported and attr.startswith("_") and not attr.startswith("__")
                and f"{imported[base]}.{attr}" not in DOCUMENTED_PRIVATE):
            wrong.append(f"{name}:{node.lineno} reads {imported[base]}.{attr}")
    return wrong


def test_the_private_check_sees_a_library_private_read():
    tree = ast.parse("from multiprocessing import resource_tracker\n"
                     "t = getattr(resource_tracker, '_resource_tracker', None)\nimport os\nos._exit(0)\n")
    assert _private_library_reads("m", tree) == ["m:2 reads multiprocessing.resource_tracker._resource_tracker"]
