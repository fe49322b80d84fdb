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
        assert any((entry.dali, entry.batched, entry.vectorized, entry.joint)), cls
    module = tv2 if v2 else tv1
    for name in ("RandomResizedCrop", "Resize", "Normalize", "ColorJitter", "RandomErasing", "RandomApply"):
        assert getattr(module, name) in registry.REGISTRY


def test_fallback_names_the_users_class_in_explain():
    chain = T.Compose([TopLeftCrop(16), T.ToTensor()])
    text = gputransforms.explain(chain, "cpu")
    assert "TopLeftCrop overrides RandomResizedCrop.forward" in text, text
    assert inspect.getsource(TopLeftCrop.forward)  # (the test's own transform, as a user writes it)


_REASONS = ("NotLowerable", "NotCompilable", "_Undiscoverable", "TorchWorkers")
_ADVICE = ("to compile", "pip install", "pass num_workers=0", "put it last")


def _constants(tree: ast.AST) -> dict:
    """A module's top-level string constants (the advice texts it names)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, str):
                out[node.targets[0].id] = value
    return out


def fallback_reasons() -> list:
    """(file:line, reason, advice) of every place the package says why something runs as torchvision
    runs it: the two exceptions (reason, advice), discovery's, and the literal reasons of the torch
    workers backend. A reason passed on (``str(e)``, a plan's tail reason) is listed where it is made;
    advice named by a module constant is that constant's text."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        consts = _constants(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func) in _REASONS):
                continue
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            name = ast.unparse(node.func)
            if name == "TorchWorkers":
                reason = node.args[1]
                if isinstance(reason, (ast.Constant, ast.JoinedStr)):
                    text = ast.unparse(reason)
                    found.append((where, text, text))
                continue
            args = node.args + [k.value for k in node.keywords if k.arg == "advice"]
            reason = ast.unparse(args[0]) if args else ""
            advice = ast.unparse(args[1]) if len(args) > 1 else \
                ("_IMAGELIST" if name == "_Undiscoverable" else "")  # discovery's default advice
            found.append((where, reason, consts.get(advice, advice)))
    return found


def test_every_fallback_reason_gives_advice():
    """#33: a user told why something runs as torchvision runs it is told what would compile instead."""
    reasons = fallback_reasons()
    assert len(reasons) >= 60  # the scan sees them (exceptions, discovery's, the workers' literals)
    missing = [(w, r) for w, r, a in reasons if not a]
    assert not missing, missing
    vague = [(w, a) for w, r, a in reasons
             if a != "e.advice" and not any(m in a for m in _ADVICE + ("gputransforms.compile",))]
    assert not vague, vague


def test_the_advice_reaches_the_warning(indexed_folder):
    """The advice is in the FallbackWarning and in explain(), after the reason."""
    import warnings

    from gputransforms import datasets
    from gputransforms import transforms as T2
    root = str(indexed_folder)
    chain = T2.Compose([T2.RandomCrop(16, padding=2, padding_mode="reflect"), T2.ToTensor()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = gputransforms.DataLoader(datasets.ImageFolder(root, transform=chain), batch_size=2, device="cpu")
    text = " ".join(str(w.message) for w in caught)
    assert "padding_mode='reflect'" in text and "use padding_mode='constant'" in text, text
    assert "use padding_mode='constant'" in loader.explain()


def _public_names() -> list:
    """(name, object) of every public name the package defines itself: its __all__, compile, and the
    datasets and transforms it adds to torchvision's (torchvision's own re-exports are its business)."""
    from gputransforms import datasets, transforms

    names = [(n, getattr(gputransforms, n)) for n in gputransforms.__all__ if n not in ("datasets", "transforms")]
    names.append(("compile", gputransforms.compile))
    for mod in (datasets, transforms):
        for n in getattr(mod, "__all__", dir(mod)):
            obj = getattr(mod, n, None)
            if getattr(obj, "__module__", "").startswith("gputransforms") and not n.startswith("_"):
                names.append((f"{mod.__name__}.{n}", obj))
    return names


def test_every_public_name_has_a_docstring_and_type_hints():
    """#33: help() says something for each public name, and its parameters are annotated."""
    names = _public_names()
    assert {"DataLoader", "explain", "compile", "FallbackWarning", "BadSampleError"} <= {n for n, _ in names}
    bare = [n for n, o in names if len(inspect.getdoc(o) or "") < 30]
    assert not bare, bare
    unhinted = []
    for n, o in names:
        fn = o.__init__ if isinstance(o, type) and not issubclass(o, BaseException) else o
        if isinstance(o, type) and issubclass(o, BaseException) or \
                not getattr(fn, "__module__", "").startswith("gputransforms"):  # torchvision's own __init__
            continue
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if any(p.annotation is inspect.Parameter.empty for p in params):
            unhinted.append((n, [p.name for p in params if p.annotation is inspect.Parameter.empty]))
    assert not unhinted, unhinted


def test_a_chain_without_timm_does_not_import_timm():
    """timm's registry entries join on the first lookup after timm's transforms exist: planning and
    building a loader over a torchvision chain never imports timm (1.1 s of a cold start on the H100
    host: timm imports huggingface_hub), and a timm chain planned afterwards still finds timm's
    entries."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gputransforms import plan, transforms as T\n"
        "assert plan(T.Compose([T.RandomResizedCrop(8), T.ToTensor()])).steps\n"
        "assert 'timm' not in sys.modules, 'timm imported'\n"
        "from timm.data import create_transform\n"
        "p = plan(create_transform(32, is_training=True, auto_augment='rand-m9-mstd0.5-inc1', interpolation='bilinear'))\n"
        "print(sorted({s.op for s in p.steps}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "timm_augment" in out.stdout, out.stdout
