"""The house stays drawn: imports inside the package run one way (no circle, function-local imports
included), the DataLoader's face stays thin, and a user's subclass of a stock transform is never
replaced by the stock lowering."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import gputransforms
from gputransforms import transforms as T
from gputransforms.compiler import registry
from gputransforms.compiler.chain import user_override

PACKAGE = Path(gputransforms.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set:
    """Lines under ``if TYPE_CHECKING:`` (never executed)."""
    lines: set = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph() -> dict:
    """module -> the package's modules it imports, anywhere in its body (functions too). ``from X
    import name`` counts as an import of ``X.name`` where that is a module, else of ``X``. A module's
    implicit import of its parent packages is not an edge (every submodule would point at them)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        is_pkg = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
                edges.update(t for t in targets if t in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for alias in node.names:
                    if f"{mod}.{alias.name}" in files:
                        edges.add(f"{mod}.{alias.name}")
                    elif mod in files:
                        edges.add(mod)
        graph[name] = edges - {name}
    return graph


def circles(graph: dict) -> list:
    """Every strongly connected set of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_imports_have_no_circles():
    graph = import_graph()
    assert "gputransforms.backends.compiled" in graph["gputransforms.backends"]  # the walk sees the package
    assert "gputransforms.compiler.timm_augment" in graph["gputransforms.compiler.lowerings"]
    assert circles(graph) == []


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_face_is_thin():
    """The file that defines DataLoader stays a face; no function of the package grows past 60 lines
    unless its docstring says why."""
    assert len((PACKAGE / "loader.py").read_text().splitlines()) <= 250
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if length > 60 and "long because" not in doc:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({length} lines)")
    assert long == []


# --- a user's subclass runs as written ----------------------------------------------------------------

class TopLeftCrop(T.RandomResizedCrop):
    """Always the top-left corner (a user's forward)."""

    def forward(self, img):
        from torchvision.transforms import functional as F

        w, h = F.get_image_size(img)
        return F.resized_crop(img, 0, 0, h // 2, w // 2, self.size, self.interpolation, antialias=True)


class VerticalFlip(T.RandomHorizontalFlip):
    def forward(self, img):
        from torchvision.transforms import functional as F

        return F.vflip(img) if torch.rand(1) < self.p else img


class OwnParams(T.RandomCrop):
    @staticmethod
    def get_params(img, output_size):
        return 0, 0, output_size[0], output_size[1]


class OnlyADefault(T.RandomHorizontalFlip):
    def __init__(self, p=1.0):
        super().__init__(p)


def test_registry_looks_classes_up_by_exact_type():
    assert registry.lookup(T.RandomResizedCrop(8)) is registry.REGISTRY[T.RandomResizedCrop]
    for t in (TopLeftCrop(8), VerticalFlip(), OwnParams(8)):
        assert registry.lookup(t) is None and user_override(t), type(t).__name__
    assert registry.lookup(OnlyADefault()) is registry.REGISTRY[T.RandomHorizontalFlip]
    assert user_override(OnlyADefault()) is None
    assert registry.batched_of(T.RandomApply([VerticalFlip()])) is None  # a member that is the user's


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_every_class_has_one_entry(v2):
    """Each entry names a lowering, and v1 and v2 spellings of one transform share their kinds."""
    from torchvision.transforms import v2 as tv2

    import torchvision.transforms as tv1

    for cls, entry in registry.REGISTRY.items():
        assert any((entry.dali, entry.batched, entry.vectorized)), cls
    module = tv2 if v2 else tv1
    for name in ("RandomResizedCrop", "Resize", "Normalize", "ColorJitter", "RandomErasing", "RandomApply"):
        assert getattr(module, name) in registry.REGISTRY


def test_fallback_names_the_users_class_in_explain():
    chain = T.Compose([TopLeftCrop(16), T.ToTensor()])
    text = gputransforms.explain(chain, "cpu")
    assert "TopLeftCrop overrides RandomResizedCrop.forward" in text, text
    assert inspect.getsource(TopLeftCrop.forward)  # (the test's own transform, as a user writes it)
