"""The package's layout rules (docs/architecture.md): imports point down, no circles, short modules; the tests
mirror the package.

Every ``import`` in ``refllm/`` (at the top of a module or inside a function)
is read with ``ast``. A module may import its own layer and the layers below
it, never above; the import graph between modules has no cycle; no module is
longer than 400 lines. Every test file sits in the folder of what it tests, and
imports nothing of tests/ but tests/helpers/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import refllm
from refllm.families import FAMILY_MODULES

PACKAGE = Path(refllm.__file__).parent
TESTS = PACKAGE.parent / "tests"
MAX_LINES = 400

# Bottom to top. A module's layer is that of the longest prefix of its dotted name listed here.
LAYERS = [
    ("refllm.errors", "refllm.config", "refllm.config_checks", "refllm.rope_parameters", "refllm.moe_parameters",
     "refllm.families", "refllm.recipe", "refllm.progress"),
    ("refllm.nn",),
    ("refllm.kernels", "refllm.machine"),
    ("refllm.quant",),
    ("refllm.kv",),
    ("refllm.models",),
    ("refllm.tracing",),
    ("refllm.io",),
    ("refllm.catalog", "refllm.loading", "refllm.memory"),
    ("refllm.runtime",),
    ("refllm.testing",),
    ("refllm.server",),
    ("refllm.cluster",),
    ("refllm.commands", "refllm.cli", "refllm.__main__", "refllm"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> int:
    best = max(
        ((len(prefix), rank) for rank, group in enumerate(LAYERS) for prefix in group
         if name == prefix or name.startswith(prefix + ".")),
        default=None,
    )
    assert best is not None, f"{name} has no layer in tests/test_layout.py"
    return best[1]


def imported_modules(path: Path) -> set[str]:
    """The refllm modules ``path`` imports, resolved to modules that exist (``from pkg import module`` too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from package import module`` imports that module; ``from module import name``, the module
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names]
        else:
            continue
        found |= {name for name in names if name in MODULES}
    return found - {"refllm"}  # the package itself: its version, or the way to a submodule


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(path): path for path in FILES}
GRAPH = {name: imported_modules(path) - {name} for name, path in MODULES.items()}


def test_imports_point_down():
    upward = [
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if layer(target) > layer(name)
    ]
    assert upward == []


def test_no_import_circles():
    graph = {name: targets for name, targets in GRAPH.items() if name != "refllm"}  # the front door re-exports
    state: dict[str, str] = {}
    cycles = []

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_every_module_is_short():
    long = {module_name(path): n for path in FILES if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_spec_imports_nothing_but_the_spec():
    """nn/ is read alone: it imports no config parsing, no family, nothing of refllm outside nn/."""
    outside = {f"{name} imports {target}" for name, targets in GRAPH.items() if name.startswith("refllm.nn")
               for target in targets if not target.startswith("refllm.nn")}  # fmt: skip
    assert outside == set()


def listed_modules(doc: str, root: str = "refllm/") -> set[str]:
    """The modules the code block of docs/architecture.md that lists ``root`` names, as paths under it
    ("nn/rope.py"; a package as its folder, "nn/"). A line names modules when its first column (up to two
    spaces) is made of names ending in ".py" or "/"; a name ending in "/" opens a package for the lines indented
    under it. "<family>.py" stands for the family modules the registry names (a new family is its module and a
    line there, not a line here too); another name in <> stands for a rule, not for a module."""
    block = next(block for block in doc.split("```")[1::2] if block.splitlines()[1:2] == [root])
    listed, packages = set(), []  # packages: (indent, path) of the open folders
    for line in block.splitlines()[2:]:  # past the language tag and the root
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0].split(" ")
        if not line.strip() or not all(name.endswith((".py", "/")) for name in names):
            continue  # a description carried over from the line above
        packages = [(level, path) for level, path in packages if level < indent]
        prefix = packages[-1][1] if packages else ""
        listed |= {prefix + name for name in names if "<" not in name}
        listed |= {f"{prefix}{family}.py" for family in FAMILY_MODULES if "<family>.py" in names}
        packages += [(indent, prefix + name) for name in names if name.endswith("/")]
    return listed


def test_the_architecture_doc_lists_every_module():
    """docs/architecture.md names every module of refllm/, and nothing that is not one."""
    tree = {str(path.relative_to(PACKAGE)) for path in FILES if path.name != "__init__.py"}
    tree |= {str(path.relative_to(PACKAGE).parent) + "/" for path in FILES if path.name == "__init__.py"} - {"./"}
    listed = listed_modules((PACKAGE.parent / "docs" / "architecture.md").read_text())
    listed = {name for name in listed if not name.endswith("__init__.py")}  # a package's: named by its folder
    assert {"missing from the doc": sorted(tree - listed), "not in the tree": sorted(listed - tree)} == {
        "missing from the doc": [], "not in the tree": []
    }


# Family names as prose spells them (llama3 is a RoPE type, llama.cpp a program)
FAMILY_NAME = re.compile(
    r"\b(llama(?!3|\.cpp)|mistral|qwen|phi-?3|gemma|smollm|olmo|mixtral|deepseek|gpt[-_ ]?oss|granite|cohere|command-r|idefics|smolvlm|siglip)",
    re.IGNORECASE,
)


def test_the_spec_names_no_family():
    """nn/ is the math alone: which family uses what is its family module's to say (refllm/families/)."""
    named = {f"{name}: {match.group(0)}" for name, path in MODULES.items() if name.startswith("refllm.nn")
             for match in FAMILY_NAME.finditer(path.read_text())}  # fmt: skip
    assert named == set()


def hot_paths() -> dict[str, ast.FunctionDef]:
    """The forward pass and what it calls per layer: DecoderModel._forward and every block's __call__ (a
    vision-language model's connector too)."""
    found = {}
    blocks = ("refllm.models.decoder", "refllm.models.blocks", "refllm.models.attention", "refllm.models.connector",
              "refllm.models.fused_layer")  # fmt: skip
    for name in blocks:
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            if isinstance(node, ast.ClassDef):
                for function in node.body:
                    if isinstance(function, ast.FunctionDef) and function.name in ("__call__", "_forward"):
                        found[f"{node.name}.{function.name}"] = function
    return found


def test_the_forward_pass_asks_no_family_anything():
    """Every choice of a family's recipe is made at load, into the blocks: the forward pass and the blocks' calls
    branch on nothing, read no config and name no family."""
    paths = hot_paths()
    assert {"DecoderModel._forward", "DecoderLayer.__call__", "GroupedQueryAttentionBlock.__call__",
            "FusedDecoderLayer.__call__", "FusedLayerCall.__call__"} <= set(paths)  # fmt: skip
    asked = []
    for name, function in paths.items():
        for node in ast.walk(function):
            if isinstance(node, (ast.If, ast.IfExp, ast.Match)):
                asked.append(f"{name} branches at line {node.lineno}")
            if isinstance(node, ast.Attribute) and node.attr in ("config", "recipe", "model_type"):
                asked.append(f"{name} reads .{node.attr} at line {node.lineno}")
        if FAMILY_NAME.search(ast.unparse(function)):
            asked.append(f"{name} names a family")
    assert asked == []


# ---- the tests ------------------------------------------------------------------------------------------

TEST_CODE = sorted(path for path in TESTS.rglob("*.py") if "data" not in path.relative_to(TESTS).parts)
TESTS_LISTED = listed_modules((PACKAGE.parent / "docs" / "architecture.md").read_text(), root="tests/")
PACKAGES = {str(path.relative_to(PACKAGE).parent) for path in FILES if path.name == "__init__.py"} - {"."}
MODULE_TESTS = {f"test_{path.stem}.py" for path in PACKAGE.glob("*.py")}  # tests/test_<module>.py
# The folders of tests/ that are not a package's: those the doc lists (parity/, robustness/, helpers/, ...)
OTHER_FOLDERS = {name.rstrip("/") for name in TESTS_LISTED if name.count("/") == 1 and name.endswith("/")}
NOT_TESTS = {"helpers", "tools", "data"}


def imported_from_tests(path: Path) -> list[str]:
    """What ``path`` imports of tests/, by dotted name ("tests.helpers.paths"); a relative import as its dots and
    module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.ImportFrom):
            found += [f"tests.{alias.name}" for alias in node.names] if node.module == "tests" else [node.module]
    return [name for name in found if name.startswith(".") or name.split(".")[0] == "tests"]


def test_no_test_file_imports_another():
    """Test files share code through tests/helpers/ (and fixtures through a conftest.py), never by importing
    each other: a test module reads alone, and moves without taking others along."""
    imports = {f"{path.relative_to(TESTS)}: {name}" for path in TEST_CODE for name in imported_from_tests(path)
               if name.split(".")[:2] != ["tests", "helpers"]}  # fmt: skip
    assert imports == set()


def test_every_test_file_sits_in_the_folder_of_what_it_tests():
    """tests/<package>/ holds the tests of refllm/<package>/, tests/test_<module>.py those of refllm/<module>.py;
    the other folders and files of tests are those docs/architecture.md lists."""
    folders = PACKAGES | OTHER_FOLDERS - NOT_TESTS
    misplaced = []
    for path in TESTS.rglob("test_*.py"):
        where = path.parent.relative_to(TESTS)
        if not (path.name in MODULE_TESTS | TESTS_LISTED if where == Path(".") else str(where) in folders):
            misplaced.append(str(path.relative_to(TESTS)))
    assert misplaced == []


def test_every_folder_of_tests_is_a_package_the_doc_accounts_for():
    """A folder of tests/ is named for a package of refllm's or listed in the doc; a folder holding code is a
    Python package, so that pytest imports test files of one name in two folders as two modules."""
    top = {path.name for path in TESTS.iterdir() if path.is_dir() and path.name != "__pycache__"}
    no_init = {str(path.parent.relative_to(TESTS)) for path in TEST_CODE if not (path.parent / "__init__.py").exists()}
    found = {"unknown": top - PACKAGES - OTHER_FOLDERS, "listed, not in the tree": OTHER_FOLDERS - top,
             "without __init__.py": no_init}  # fmt: skip
    assert found == {"unknown": set(), "listed, not in the tree": set(), "without __init__.py": set()}


def test_the_architecture_doc_lists_every_test_helper_and_tool():
    """docs/architecture.md names every module of tests/helpers/ and tests/tools/, and every file of tests/ that
    is not the test of a module of refllm, and nothing that is not one."""
    not_module_tests = {path for path in TEST_CODE if path.parent == TESTS and path.name not in MODULE_TESTS}
    tree = {str(path.relative_to(TESTS)) for path in TEST_CODE if path.name != "__init__.py"
            and (path.parent.name in ("helpers", "tools") or path in not_module_tests)}  # fmt: skip
    listed = {name for name in TESTS_LISTED if name.endswith(".py")}
    assert {"missing from the doc": sorted(tree - listed), "not in the tree": sorted(listed - tree)} == {
        "missing from the doc": [], "not in the tree": []
    }
