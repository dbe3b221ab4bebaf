"""Rules of shape the review would otherwise have to remember.

- Shipped code never imports the tests (tests/core/test_imports.py).
- A class declares only attributes it sets itself: a class-level annotation
  with no value that none of the class's own methods assigns is an attribute
  of some other class, borrowed by a mixin. Records (dataclasses, NamedTuples,
  TypedDicts, Protocols, enums, pydantic models) declare fields by design.
- Every asyncio.Queue on the read path (daemon/, relay/, oplog/) has a bound:
  an unbounded one stops the stream's back-pressure and lets memory grow
  with a burst.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("api", "writer", "db", "chat", "daemon", "oplog", "relay", "chatctl", "cluster", "harness", "loadtest")
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
