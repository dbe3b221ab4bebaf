"""Rules of shape the review would otherwise have to remember.

- Shipped code never imports the tests (tests/core/test_imports.py).
- A class declares only attributes it sets itself: a class-level annotation
  with no value that none of the class's own methods assigns is an attribute
  of some other class, borrowed by a mixin. Records (dataclasses, NamedTuples,
  TypedDicts, Protocols, enums, pydantic models) declare fields by design.
- Every asyncio.Queue on the read path (daemon/, relay/, oplog/) has a bound:
  an unbounded one stops the stream's back-pressure and lets memory grow
  with a burst.
- No two top-level classes or type aliases of shipped code share a name: a
  reader (and a grep) takes one ``Message`` for the other, and an import
  that picks the wrong one may still type-check where the two look alike.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("api", "writer", "db", "chat", "daemon", "oplog", "relay", "pusher", "chatctl", "cluster", "harness",
           "loadtest")
READ_PATH = ("daemon", "relay", "oplog")
RECORD_BASES = {"NamedTuple", "TypedDict", "Protocol", "Enum", "IntEnum", "StrEnum", "Flag", "BaseModel",
                "BaseSettings"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _is_record(cls: ast.ClassDef) -> bool:
    return ("dataclass" in {_name(d) for d in cls.decorator_list}
            or bool({_name(b) for b in cls.bases} & RECORD_BASES))


def _assigned_on_self(cls: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for method in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(method):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            found |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                      and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")}
    return found


def borrowed_attributes(tree: ast.AST) -> list[str]:
    """``Class.attribute`` for each attribute a class declares but never sets."""
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if _is_record(cls):
            continue
        declared = {s.target.id for s in cls.body
                    if isinstance(s, ast.AnnAssign) and s.value is None and isinstance(s.target, ast.Name)}
        found += [f"{cls.name}.{name}" for name in sorted(declared - _assigned_on_self(cls))]
    return found


def unbounded_queues(tree: ast.AST) -> list[int]:
    """The line of each asyncio.Queue(...) made without a positive maxsize written out."""
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr in ("Queue", "LifoQueue", "PriorityQueue")
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "asyncio"):
            continue
        size = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "maxsize"), None)
        if size is None or (isinstance(size, ast.Constant) and not (isinstance(size.value, int) and size.value > 0)):
            found.append(call.lineno)
    return found


# A type's name has a lower-case letter: ``Encoded``, not the constant ``LIMIT``.
TYPE_NAME = re.compile(r"_*[A-Z]\w*[a-z]\w*")


def _is_type(value: ast.expr) -> bool:
    """``tuple[...]``, ``A | B`` or another type's name."""
    return (isinstance(value, (ast.Subscript, ast.Name, ast.Attribute))
            or isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr))


def top_level_types(tree: ast.AST) -> list[str]:
    """The names of a module's top-level classes and type aliases: ``X = tuple[...]``
    (a type's name bound to a subscript, a union or a name), ``X: TypeAlias = ...``
    and ``type X = ...``. A TypeVar or a NewType is a call: not an alias here."""
    found = []
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.ClassDef):
            found.append(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if TYPE_NAME.fullmatch(node.targets[0].id) and _is_type(node.value):
                found.append(node.targets[0].id)
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and _name(node.annotation) == "TypeAlias"):
            found.append(node.target.id)
        elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12)
            found.append(node.name.id)
    return found


def shared_type_names(trees: dict[str, ast.AST]) -> dict[str, list[str]]:
    """Each class or type alias name that more than one definition takes, with where they are."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, tree in trees.items():
        for name in top_level_types(tree):
            where[name].append(module)
    return {name: modules for name, modules in where.items() if len(modules) > 1}


def modules(packages: tuple[str, ...]) -> dict[str, ast.AST]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p))
            for package in packages for p in sorted((ROOT / package).rglob("*.py"))}


def test_no_class_declares_an_attribute_it_does_not_set():
    assert {name: found for name, tree in modules(SHIPPED).items() if (found := borrowed_attributes(tree))} == {}


def test_every_queue_on_the_read_path_is_bounded():
    assert {name: found for name, tree in modules(READ_PATH).items() if (found := unbounded_queues(tree))} == {}


def test_the_checks_see_a_borrowing_mixin_and_an_unbounded_queue():
    mixin = ast.parse(
        "class Steps:\n    _engine: object\n    _count: int\n    def run(self):\n        self._count = 1\n"
        "@dataclass\nclass Row:\n    id: int\n"
        "class Owner:\n    engine: object\n    def __init__(self, engine):\n        self.engine = engine\n")
    assert borrowed_attributes(mixin) == ["Steps._engine"]
    queues = ast.parse("import asyncio\na = asyncio.Queue()\nb = asyncio.Queue(0)\nc = asyncio.Queue(maxsize=8)\n"
                       "d = asyncio.Queue(LIMIT)\ne = asyncio.Queue(maxsize=0)\n")
    assert unbounded_queues(queues) == [2, 3, 6]


def test_no_two_classes_or_type_aliases_of_shipped_code_share_a_name():
    assert shared_type_names(modules(SHIPPED)) == {}


def test_the_check_sees_a_class_or_a_type_alias_named_twice():
    trees = {
        "a.py": ast.parse("class Message:\n    pass\nEncoded = tuple[int, bytes]\nLIMIT = 3\nT = TypeVar('T')\n"
                          "Limit = 1 + 2\n"),
        "b.py": ast.parse("class Message(NamedTuple):\n    data: bytes\nLIMIT = 4\nT = TypeVar('T')\n"
                          "Item: TypeAlias = int | str\nRoute = Callable[[int], None]\n"),
        "c.py": ast.parse("Encoded = dict[str, int] | None\nclass Item:\n    pass\nname = str\nLimit = 2 * 3\n"
                          "def f():\n    class Route:\n        pass\n"),
    }
    assert shared_type_names(trees) == {"Message": ["a.py", "b.py"], "Encoded": ["a.py", "c.py"],
                                        "Item": ["b.py", "c.py"]}
