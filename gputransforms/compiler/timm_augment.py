"""timm's automatic augmentations in the DALI graph: ``RandAugment`` (``rand-m9-mstd0.5-inc1`` and the
rest of its config language: ``n``, ``p``, ``mstd`` including uniform sampling, ``mmax``, ``inc``,
unweighted op sets) and ``AutoAugment`` (``original``, ``originalr``, ``v0``, ``v0r`` and DeiT III's
``3a``), lowered op for op from ``timm/data/auto_augment.py``.

timm applies, per image and per layer: pick an op (RandAugment: uniformly, with replacement; AutoAugment:
one sub-policy, then its ops in order), apply it with the op's probability, at a magnitude drawn as
``clip(gauss(m, mstd), 0, mmax or 10)`` (``uniform(0, m)`` when mstd is infinite), mapped to the op's
argument by timm's level function, with a random sign where timm negates. The graph draws the same
per sample (DALI's random operators, so the draws are DALI's numbers, not Python's: tested by
distribution against timm's own transform) and routes each sample to its op with DALI's
conditionals (an if/else chain on the leaf index, the most frequent leaf first).

The ops follow PIL's formulas, as timm calls them: affine warps as PIL's inverse maps (pixel centres at
+0.5, the rotation about (w/2, h/2)), filled with timm's per-channel ``img_mean`` (warped in float
around the fill, since DALI's warp fills with one number), enhance blends truncated as PIL's
``Image.blend``, ``Contrast`` about the rounded mean of PIL's L image. What differs measurably:
``Equalize`` is DALI's (OpenCV's lookup table, not PIL's), ``Sharpness`` smooths the 1-pixel border
where PIL keeps it, a warp blends the fill into its border pixels, and the Gaussian blurs are true
Gaussians where PIL approximates with box blurs.

``describe`` (plan time) reads the timm object and raises NotLowerable for what this does not cover
(a weighted op choice over several layers, which timm draws without replacement; a random
interpolation per op; an op or level function that is not timm's); ``lower`` builds the graph.
"""
from __future__ import annotations

import math

import numpy as np

from .chain import NotLowerable


def is_node(x) -> bool:
    """A DALI node (per-sample values), not Python numbers or a list of them (``dali_scalars.is_node``
    without the list, in a module that imports DALI: this one must import without it)."""
    return not isinstance(x, (int, float, list))


_LEVEL_DENOM = 10.0
_GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}
_SIGNED = _GEOMETRIC | {"ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"}
_BLENDS = {"Color", "Contrast", "Brightness", "Sharpness", "ColorIncreasing", "ContrastIncreasing",
           "BrightnessIncreasing", "SharpnessIncreasing"}
SUPPORTED = _GEOMETRIC | {
    "AutoContrast", "Equalize", "Invert", "Posterize", "PosterizeIncreasing", "PosterizeOriginal", "Solarize",
    "SolarizeIncreasing", "SolarizeAdd", "Color", "ColorIncreasing", "Contrast", "ContrastIncreasing",
    "Brightness", "BrightnessIncreasing", "Sharpness", "SharpnessIncreasing", "Desaturate", "GaussianBlur",
    "GaussianBlurRand"}


# --- plan time: what the timm object asks for ------------------------------------------------------

def _interp(resample, name: str) -> str:
    from PIL import Image

    if isinstance(resample, (list, tuple)):
        raise NotLowerable(f"timm {name}: a random interpolation per op (DALI's warps: nearest, bilinear)",
                           "to compile it, give the policy interpolation='bilinear' (timm's hparams)")
    if resample == Image.Resampling.BILINEAR:
        return "INTERP_LINEAR"
    if resample == Image.Resampling.NEAREST:
        return "INTERP_NN"
    raise NotLowerable(f"timm {name}: interpolation {resample!r} (DALI's warps: nearest, bilinear)",
                       "to compile it, give the policy interpolation='bilinear' (timm's hparams)")


def _op_spec(op, owner: str) -> dict:
    from timm.data import auto_augment as aa

    name = getattr(op, "name", None)
    if type(op) is not aa.AugmentOp or name not in SUPPORTED:
        raise NotLowerable(f"timm {owner}: op {op!r} has no lowering",
                           "to compile it, keep to timm's own op names (docs/compatibility.md lists them)")
    if op.aug_fn is not aa.NAME_TO_OP[name] or op.level_fn is not aa.LEVEL_TO_ARG[name]:
        raise NotLowerable(f"timm {owner}: op {name} with its own function",
                           "to compile it, use timm's own op functions")
    fill = op.kwargs.get("fillcolor", aa._FILL)
    fill = [float(fill)] * 3 if isinstance(fill, (int, float)) else [float(f) for f in fill]
    if len(fill) != 3:
        raise NotLowerable(f"timm {owner}: fill {fill}", "to compile it, give an RGB fill (3 values) or one number")
    std = float(op.magnitude_std or 0.0)
    return dict(name=name, prob=float(op.prob), magnitude=float(op.magnitude), mstd=std,
                upper=float(op.magnitude_max or _LEVEL_DENOM), fill=fill,
                interp=_interp(op.kwargs.get("resample"), name) if name in _GEOMETRIC else None,
                translate_pct=float(op.hparams.get("translate_pct", 0.45)),
                translate_const=float(op.hparams.get("translate_const", 250)))


def describe(t) -> dict:
    """The step's arguments for a timm RandAugment or AutoAugment: ``ops`` (one spec per op), and per
    layer, how a sample picks its op: RandAugment draws an op index per layer (``weights`` or uniform);
    AutoAugment draws a sub-policy once, and ``table[j][s]`` is the op of sub-policy s at position j
    (``len(ops)``, the identity, where a sub-policy is shorter)."""
    from timm.data import auto_augment as aa

    if type(t) is aa.RandAugment:
        weights = None if t.choice_weights is None else [float(w) for w in t.choice_weights]
        if weights is not None and t.num_layers > 1:
            raise NotLowerable("timm RandAugment: a weighted op choice over several layers (drawn without replacement)",
                               "to compile it, drop the weights (timm's default: a uniform choice)")
        ops = [_op_spec(op, "RandAugment") for op in t.ops]
        return dict(policy="timm_augment", mode="rand", ops=ops, layers=int(t.num_layers), weights=weights)
    if type(t) is aa.AutoAugment:
        ops, table = [], []
        for sub in t.policy:
            table.append([])
            for op in sub:
                table[-1].append(len(ops))
                ops.append(_op_spec(op, "AutoAugment"))
        layers = max(len(s) for s in table)
        table = [[s[j] if j < len(s) else len(ops) for s in table] for j in range(layers)]
        return dict(policy="timm_augment", mode="auto", ops=ops, layers=layers, table=table)
    raise NotLowerable(f"{type(t).__name__}: no DALI lowering",
                       "to compile it, use timm's RandAugment, AutoAugment or AugMixAugment from its factories")


# --- graph time ------------------------------------------------------------------------------------
#
# DALI runs each arithmetic operator of an expression as an operator of its own, its executor runs
# one CPU operator at a time, and a CPU operator on per-sample numbers costs about 20 us plus 0.5-1 us
# per sample it computes (benchmarks/probes/nvtx_ranges.c, H100): the CPU operators bounded this
# graph. So the graph draws all layers at once (a vector per sample), computes what only one leaf
# needs inside that leaf (on its samples only), routes the samples by an if/else chain whose later
# splits see only what the earlier ones left, hands the branches as few nodes as it can (each node a
# branch reads is split for it), keeps magnitudes without noise as Python numbers, and builds a
# shear's or translation's matrix as one constant combination.

def _plain(f):
    """DALI's ``do_not_convert``: ``f`` never branches on a DataNode, so AutoGraph need not rewrite
    it (what costs the build time: compiler/dali.py ``_quick_trace``)."""
    try:
        from nvidia.dali.pipeline import do_not_convert
    except ImportError:  # planning without DALI installed
        return f
    return do_not_convert(f)


def lower(g, step, **_) -> None:
    a = step.args
    draws = _draws(a)
    leaves, leaf_of = _leaves(a["ops"])
    img = g.img
    for j in range(a["layers"]):
        chosen, layer = _layer(a, draws, j, leaf_of)
        img = _switch(g, chosen, _order(a, j, leaf_of), img, leaves, layer)
    g.img = img


@_plain
def _leaves(ops: list) -> tuple:
    """The switch's leaves and, where they differ from ``ops``, each op's leaf (the identity last).
    The warps (rotation, shears, translations) are one leaf when they share interpolation, fill and
    magnitude: one warp runs on the samples that chose any of them, each sample's matrix built in the
    leaf for the op it drew (``_warps_matrix``). A branch costs a split and a merge, and a split of
    each node it reads: five warp branches of two layers were 244 of timm RandAugment's 634 operators."""
    def group(names, same):
        members = [i for i, op in enumerate(ops) if op["name"] in names]
        if len(members) < 2 or len({same(ops[i]) for i in members}) > 1:
            return []
        return members

    magnitude = lambda op: (op["magnitude"], op["mstd"], op["upper"])  # noqa: E731
    groups = {"Warps": group(_GEOMETRIC, lambda op: (op["interp"], tuple(op["fill"]), magnitude(op))),
              "Blends": group(_BLENDS, lambda op: (op["name"].endswith("Increasing"), magnitude(op)))}
    if not any(groups.values()):
        return ops, None
    leaves, leaf_of = [], []
    for i, op in enumerate(ops):
        name = next((g for g, members in groups.items() if i in members), None)
        if name is None:
            leaves.append(op)
        elif i == groups[name][0]:
            leaves.append(dict(op, name=name, ops=ops))  # (each index's op)
        leaf_of.append(len(leaves) - 1 if name is None or i == groups[name][0] else leaf_of[groups[name][0]])
    return leaves, leaf_of + [len(leaves)]


def _shared_magnitude(ops: list) -> bool:
    """Whether every op draws its magnitude alike (RandAugment's ops do): then one signed level per
    sample and layer serves them all."""
    return len({(op["magnitude"], op["mstd"], op["upper"]) for op in ops}) == 1


@_plain
def _draws(a: dict) -> dict:
    """The random draws of all layers at once (each a vector of one number per layer): the op and
    whether it applies (RandAugment with one probability for all ops: ``key``, in one draw; else the op
    index or sub-policy and the coin), and where the ops share their magnitude, the signed level
    itself, ``clip(gauss(m, mstd), 0, upper) / 10`` times a random sign, in three operators for all
    layers (operators on every sample of the batch are the graph's costliest:
    benchmarks/probes/nvtx_ranges.c); else the sign and the magnitude's noise, for ``_level_of``."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    ops, shape = a["ops"], (a["layers"],)
    k = len(ops)
    probs = {op["prob"] for op in ops}
    if a["mode"] == "rand" and len(probs) == 1:
        draws = dict(key=_key_draw(k, a["weights"], probs.pop(), shape))
    else:
        if a["mode"] == "rand":
            if a["weights"] is not None:
                pick = fn.random.choice(k, p=a["weights"], shape=shape)
            else:
                pick = fn.random.uniform(values=list(range(k)), shape=shape, dtype=types.INT32)
        else:
            pick = fn.random.uniform(values=list(range(len(a["table"][0]))), dtype=types.INT32)
        if len(probs) == 1:  # applied or not, as the offset of the leaf lookup's key (_layer): 0 or k + 1
            p = min(max(probs.pop(), 0.0), 1.0)
            draws = dict(pick=pick, applied=fn.random.choice([0, k + 1], p=[1.0 - p, p], shape=shape))
        else:
            draws = dict(pick=pick, apply=fn.random.uniform(range=[0.0, 1.0], shape=shape))
    if any(op["name"] == "GaussianBlurRand" for op in ops):
        draws["blur"] = fn.random.uniform(range=[0.0, 1.0], shape=shape)
    if _shared_magnitude(ops):
        op = ops[0]
        step = 1.0 / _LEVEL_DENOM  # the sign and the division by 10 in one factor (exact: a sign flip)
        if op["mstd"] == 0:
            level = _level_of(op, {})  # a number
            draws["signed"] = fn.random.uniform(values=[-level, level], shape=shape)
            return draws
        if math.isinf(op["mstd"]):
            m = fn.random.uniform(range=[0.0, op["magnitude"]], shape=shape)
        else:
            m = fn.random.normal(mean=op["magnitude"], stddev=op["mstd"], shape=shape)
        draws["signed"] = dmath.clamp(m, 0.0, op["upper"]) * fn.random.uniform(values=[-step, step], shape=shape)
        return draws
    draws["sign"] = fn.random.uniform(values=[-1.0, 1.0], shape=shape)
    noisy = [op for op in ops if op["mstd"] > 0]
    if any(not math.isinf(op["mstd"]) for op in noisy):
        draws["normal"] = fn.random.normal(shape=shape)
    if any(math.isinf(op["mstd"]) for op in noisy):
        draws["uniform"] = fn.random.uniform(range=[0.0, 1.0], shape=shape)  # magnitudes when mstd is infinite
    return draws


def _key_draw(k: int, weights, prob: float, shape):
    """RandAugment's op and whether it applies, in one draw: the key ``_layer`` would build from them,
    0 for a sample left as it is, ``k + 1 + i`` for op i applied (one random operator and no sum per
    layer)."""
    import nvidia.dali.fn as fn

    p = min(max(prob, 0.0), 1.0)
    values, chances = ([0], [1.0 - p]) if p < 1.0 else ([], [])
    for i, w in enumerate(weights or [1.0 / k] * k):
        if w * p > 0:
            values.append(k + 1 + i)
            chances.append(w * p)
    total = sum(chances)
    return fn.random.choice(values, p=[c / total for c in chances], shape=shape)


@_plain
def _layer(a: dict, draws: dict, j: int, leaf_of):
    """Layer ``j``'s chosen leaf per sample (the last: none) and the nodes its branches read: ``key``, the
    op index plus ``k + 1`` where the op is applied (the leaves' lookups by op index are keyed by it:
    inside a leaf every sample is applied), and the draws of the layer. What only one leaf needs (the
    warps' matrix, the blends' factor) is computed inside that leaf, on its samples only: a CPU operator
    costs the pipeline in proportion to the samples it computes (benchmarks/probes/nvtx_ranges.c)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    ops = a["ops"]
    k = len(ops)
    layer = {key: node[j] for key, node in draws.items() if key != "pick"}
    if "key" not in layer:
        if a["mode"] == "rand":
            idx = draws["pick"][j]
        else:
            idx = fn.lookup_table(draws["pick"], keys=list(range(len(a["table"][j]))), values=a["table"][j],
                                  dtype=types.INT32, default_value=k)
        if "applied" in layer:
            offset = layer.pop("applied")
        else:
            probs = [op["prob"] for op in ops]
            p = fn.lookup_table(idx, keys=list(range(k)), values=probs, dtype=types.FLOAT, default_value=0.0)
            offset = (layer.pop("apply") < p) * (k + 1)
        layer["key"] = idx + offset
    # the leaf, in one lookup: idx (k where a sub-policy has no op here) for applied samples, the
    # identity (the last leaf) for the others; key idx + (k + 1) * applied
    leaf = list(range(k + 1)) if leaf_of is None else list(leaf_of)
    none = leaf[k]
    chosen = fn.lookup_table(layer["key"], keys=list(range(2 * (k + 1))), values=[none] * (k + 1) + leaf,
                             dtype=types.INT32, default_value=none)
    return chosen, layer


@_plain
def _order(a: dict, j: int, leaf_of) -> list:
    """Layer ``j``'s leaves (the last, ``leaf_of[k]``: the identity) that a sample can choose, most
    often chosen first: the order of ``_switch``'s splits, each taking its leaf's samples from what the
    ones before left. A leaf no sample can choose here (an op of probability 0, an op another position of
    AutoAugment's sub-policies holds) is left out."""
    ops, k = a["ops"], len(a["ops"])
    prob = [min(max(op["prob"], 0.0), 1.0) for op in ops]
    if a["mode"] == "rand":
        weights = a["weights"] or [1.0 / k] * k
        share = [(w * p, w * (1.0 - p)) for w, p in zip(weights, prob)]  # (applied, not) per op
    else:
        column = a["table"][j]
        share = [(0.0, 0.0)] * k
        for i in column:
            if i < k:
                share[i] = (share[i][0] + prob[i] / len(column), share[i][1] + (1.0 - prob[i]) / len(column))
        share.append((0.0, column.count(k) / len(column)))  # positions a sub-policy does not reach
    leaf = list(range(k + 1)) if leaf_of is None else list(leaf_of)
    none = leaf[k]
    freq = {}
    for i, (on, off) in enumerate(share):
        if on > 0 and i < k:
            freq[leaf[i]] = freq.get(leaf[i], 0.0) + on
        if off > 0:
            freq[none] = freq.get(none, 0.0) + off
    return sorted(freq, key=lambda i: (-freq[i], i))


def _warps_matrix(g, ops: list, key, s):
    """Each sample's inverse map for whichever warp its ``key`` (op index + ``len(ops) + 1``: ``_layer``)
    names, from its signed level ``s``: ``_affine`` with the rotation's angle per unit of level and the
    shear and translation entries per unit of level looked up by op (zero for the other ops), the six
    entries in one lookup. For a single op this is ``_warp_matrix``'s matrix to the bit: the same
    ``_affine`` with the same numbers."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    k = len(ops)
    base = k + 1
    rot = fn.lookup_table(key, keys=[base + i for i in range(k)], values=[_rotation(op) for op in ops],
                          dtype=types.FLOAT, default_value=0.0)
    units = [_unit(g, op) for op in ops]
    if any(is_node(u) for u in units):  # sizes known per sample only: each op's entries weighted by its key
        unit = sum(fn.lookup_table(key, keys=[base + i], values=[1.0], dtype=types.FLOAT, default_value=0.0) * _node(u)
                   for i, u in enumerate(units) if is_node(u) or any(u))
    else:  # entry e of op i at key 6 (base + i) + e (a 2x3 key: a 2x3 matrix)
        key6 = key * 6 + types.Constant(np.arange(6, dtype=np.int32).reshape(2, 3))
        unit = fn.lookup_table(key6, keys=list(range(6 * base, 6 * (base + k))),
                               values=[float(v) for u in units for v in u], dtype=types.FLOAT, default_value=0.0)
    return _affine(g, s, rot, unit)


def _rotation(op: dict) -> float:
    """The op's angle per unit of signed level, in degrees: PIL's Image.rotate by 30 * level degrees
    counter-clockwise, whose inverse map is DALI's ``transforms.rotation`` by that angle."""
    return 30.0 if op["name"] == "Rotate" else 0.0


def _unit(g, op: dict):
    """The op's shear and translation entries of the inverse map [a, b, c, d, e, f] per unit of signed
    level: ShearX b (x += v * y), ShearY d, a translation c or f (pixels: a share of the width or
    height, or timm's constant); zero for the rotation and the other ops. Six Python numbers, or a node
    where the size is only known per sample (``_linear``)."""
    name, unit = op["name"], [0.0] * 6
    if name in ("TranslateXRel", "TranslateYRel"):
        per_size = [0.0] * 6
        per_size[2 if name == "TranslateXRel" else 5] = op["translate_pct"]
        return _linear(g, unit, per_size if name == "TranslateXRel" else None,
                       per_size if name == "TranslateYRel" else None)
    if name == "ShearX":
        unit[1] = 0.3
    elif name == "ShearY":
        unit[3] = 0.3
    elif name in ("TranslateX", "TranslateY"):
        unit[2 if name == "TranslateX" else 5] = op["translate_const"]
    return unit


def _linear(g, const: list, per_w=None, per_h=None):
    """Six entries ``const + w * per_w + h * per_h``: Python numbers where the plan knows the size, else a
    node (w and h per sample)."""
    w, h = g.w, g.h
    per_w, per_h = per_w or [0.0] * 6, per_h or [0.0] * 6
    if not (is_node(w) and any(per_w)) and not (is_node(h) and any(per_h)):
        return [c + (a * float(w) if a else 0.0) + (b * float(h) if b else 0.0) for c, a, b in zip(const, per_w, per_h)]
    from .dali_scalars import as_float

    out = _node(const)
    if any(per_w):
        out = out + as_float(w) * _node(per_w)
    if any(per_h):
        out = out + as_float(h) * _node(per_h)
    return out


def _node(values):
    """Six Python numbers as a constant 2x3 node (a node stays as it is)."""
    import nvidia.dali.types as types

    return values if is_node(values) else types.Constant(np.asarray(values, dtype=np.float32).reshape(2, 3),
                                                         device="cpu")


def _affine(g, s, rot, unit):
    """PIL's inverse map as a 2x3 matrix: a rotation by ``s * rot`` degrees about the centre (w/2, h/2)
    (PIL's ``[[cos a, sin a, t0], [-sin a, cos a, t1]]``, a = -radians, with (t0, t1) keeping the
    centre in place: DALI's ``transforms.rotation``, one operator) plus ``s * unit`` (the shear and
    translation entries): a few operators on six numbers a sample instead of one per entry and term
    (DALI runs each arithmetic operator as an operator of its own, each costing about as much per
    batch whatever it computes: benchmarks/probes/scalar_ops.py). ``rot`` and ``unit`` are Python
    numbers for one op, nodes looked up by op index for the merged warps; w and h numbers, or nodes
    where the size is only known per sample."""
    import nvidia.dali.fn as fn

    from .dali_scalars import as_float

    scaled = s * _node(unit)
    if not is_node(rot) and rot == 0.0:  # cos 0 = 1, sin 0 = 0
        return _node([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]) + scaled
    w, h = g.w, g.h
    if is_node(w) or is_node(h):
        centre = fn.stack(as_float(w) * 0.5, as_float(h) * 0.5)
    else:
        centre = [float(w) * 0.5, float(h) * 0.5]
    return fn.transforms.rotation(angle=s * rot, center=centre) + scaled


def _switch(g, chosen, order: list, img, leaves: list, layer: dict):
    """``leaves[chosen]`` on each sample (``len(leaves)``: the identity), as an if/else chain in ``order``:
    the samples of the first leaf split from the batch by DALI's conditionals (a Python ``if`` on a node:
    the pipeline is traced with conditionals on), the rest passed on to the next split, the last leaf
    applied to what is left without a test, the branches merged back on the way out. Each split,
    predicate and merge computes only the samples the leaves before left, and the operators pay per
    sample: the identity (timm's ops apply with probability 0.5) goes first, then the warps and the
    blends (five and four of RandAugment's fifteen ops)."""
    i = order[0]
    if len(order) == 1:
        return _leaf(g, img, leaves, i, layer)
    if chosen == i:
        out = _leaf(g, img, leaves, i, layer)
    else:
        out = _switch(g, chosen, order[1:], img, leaves, layer)
    return out


@_plain
def _leaf(g, img, leaves: list, i: int, layer: dict):
    return img if i == len(leaves) else _apply(g, img, leaves[i], layer)


def _floor(x):
    import nvidia.dali.math as dmath

    return dmath.floor(x) if is_node(x) else float(math.floor(x))


def _level_of(op: dict, layer: dict):
    """``clip(magnitude, 0, upper) / 10``: a Python number when the magnitude has no noise."""
    import nvidia.dali.math as dmath

    if op["mstd"] == 0:
        return min(max(op["magnitude"], 0.0), op["upper"]) / _LEVEL_DENOM
    if math.isinf(op["mstd"]):
        m = layer["uniform"] * op["magnitude"]
    else:
        m = layer["normal"] * op["mstd"] + op["magnitude"]
    return dmath.clamp(m, 0.0, op["upper"]) * (1.0 / _LEVEL_DENOM)


def _argument(op: dict, layer: dict):
    """timm's ``LEVEL_TO_ARG[name](magnitude)`` (one number per sample), for the ops that take one
    and are not warps (their matrices are built from the signed level directly)."""
    from .dali_scalars import smax, smin

    name = op["name"]
    if name.endswith("Increasing") and not name.startswith(("Posterize", "Solarize")):
        # Color/Contrast/Brightness/Sharpness: 1 +- 0.9 level, at least 0.1
        return smax(_signed(op, layer) * 0.9 + 1.0, 0.1)
    lv = _unsigned_level(op, layer)
    top = op["upper"] / _LEVEL_DENOM  # the largest level: the clips below are no-ops where it keeps inside
    if name in ("Solarize", "SolarizeIncreasing"):
        threshold = _floor(lv * 256.0) if top <= 1.0 else smin(_floor(lv * 256.0), 256.0)
        return threshold if name == "Solarize" else 256.0 - threshold
    if name == "SolarizeAdd":
        return _floor(lv * 110.0) if top * 110.0 < 128.0 else smin(_floor(lv * 110.0), 128.0)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return lv * 1.8 + 0.1
    if name == "Desaturate":  # level in [0.5, 1]; the blend factor is 1 - level
        return 1.0 - smin(smax(lv * 0.5 + 0.5, 0.5), 1.0)
    if name == "GaussianBlur":
        return smin(smax(lv * 1.9 + 0.1, 0.1), 2.0)
    if name == "GaussianBlurRand":  # radius uniform in (0.1, 2 * level)
        return layer["blur"] * (smin(smax(lv, 0.0), 1.0) * 2.0 - 0.1) + 0.1
    return None  # AutoContrast, Equalize, Invert take no argument; Posterize's mask: _posterize_mask


def _unsigned_level(op: dict, layer: dict):
    """The sample's level, ``clip(magnitude, 0, upper) / 10``: of the shared signed level where the
    layer has one, else the op's own (``_level_of``)."""
    import nvidia.dali.math as dmath

    return dmath.abs(layer["signed"]) if "signed" in layer else _level_of(op, layer)


def _signed(op: dict, layer: dict):
    if "signed" in layer:
        return layer["signed"]
    return _level_of(op, layer) * layer["sign"]


def _dev(g, x):
    """A per-sample number where the image is (a Python number stays one)."""
    return x.gpu() if g.device == "gpu" and is_node(x) else x


def _const(g, values, device=None):
    import numpy as np
    import nvidia.dali.types as types

    return types.Constant(np.asarray(values, dtype=np.float32), device=device or g.device)


def _to_uint8(x):
    """PIL's truncation of a blend into 0..255 (DALI's cast saturates)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    return fn.cast(dmath.floor(x), dtype=types.UINT8)


def _luma(img):
    """PIL's ``convert("L")`` of RGB values (uint8 or float): (R*19595 + G*38470 + B*7471 + 0x8000) >> 16,
    as one ``coord_transform`` and a floor. Exact in float32 whatever the order of the sums (or a fused
    multiply-add): each weight is a multiple of 2^-16, so every product and partial sum is a multiple of
    2^-16 below 256, which float32's 24 bits hold."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    return dmath.floor(fn.coord_transform(img, M=[19595 / 65536, 38470 / 65536, 7471 / 65536], T=[0.5],
                                          dtype=types.FLOAT))


def _blend(degenerate, x, factor):
    """PIL's ``Image.blend(degenerate, image, factor)``: degenerate + factor * (image - degenerate)."""
    return _to_uint8((x - degenerate) * factor + degenerate)


def _warp(g, img, matrix, op):
    """PIL's ``img.transform(size, AFFINE, matrix, resample, fillcolor)``: ``matrix`` maps output to
    input coordinates. DALI fills with one number; a per-channel fill is warped as the offset from it."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    interp = getattr(types, op["interp"])
    fill = op["fill"]
    if len(set(fill)) == 1:
        return fn.warp_affine(img, matrix=matrix, fill_value=fill[0], interp_type=interp, inverse_map=True)
    # x - f in float as one coord_transform (x * 1 - f), where a cast and a difference were
    offset = fn.coord_transform(img, T=[-v for v in fill], dtype=types.FLOAT)
    x = fn.warp_affine(offset, matrix=matrix, fill_value=0.0, interp_type=interp, inverse_map=True)
    return fn.cast(x + _const(g, fill), dtype=types.UINT8)  # (DALI's cast rounds, as PIL's bilinear filter does)


def _warp_matrix(g, op: dict, layer: dict):
    """The inverse map PIL's transform gets for one warp op, from the sample's signed level."""
    return _affine(g, _signed(op, layer), _rotation(op), _unit(g, op))


@_plain
def _apply(g, img, op: dict, layer: dict):
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    from .dali_scalars import smax

    name = op["name"]
    if name == "Warps":  # the warps as one leaf: each sample's matrix for the op its key names
        warp = next(o for o in op["ops"] if o["name"] in _GEOMETRIC)
        return _warp(g, img, _warps_matrix(g, op["ops"], layer["key"], _signed(warp, layer)), op)
    if name == "Blends":  # PIL's ImageEnhance ops as one leaf: a blend with the sample's own degenerate
        return _blends(g, img, op, layer)
    if name in _GEOMETRIC:
        return _warp(g, img, _warp_matrix(g, op, layer), op)
    if name == "Invert":
        return types.Constant(255, dtype=types.UINT8) - img
    if name == "Equalize":
        return fn.equalize(img)
    if name == "AutoContrast":  # per channel: lut[i] = int((i - lo) * 255 / (hi - lo)), identity if hi == lo
        return _autocontrast(img)
    if name.startswith("Posterize"):  # keep the top `bits` bits: & (256 - 2 ** (8 - bits))
        return img & _posterize_mask(g, op, layer)
    v = _argument(op, layer)
    if name.startswith("Solarize") and name != "SolarizeAdd":  # i < thresh ? i : 255 - i, and 255 - i = i ^ 255
        return img ^ ((img >= _dev(g, v)) * types.Constant(255, dtype=types.UINT8))
    if name == "SolarizeAdd":  # i < 128 ? min(255, i + add) : i
        below = img < types.Constant(128, dtype=types.UINT8)
        return fn.cast(img + below * _dev(g, v), dtype=types.UINT8)  # (the cast saturates at 255)
    if name in ("GaussianBlur", "GaussianBlurRand"):  # PIL's GaussianBlur(radius), radius as sigma
        return fn.gaussian_blur(img, sigma=smax(v, 0.1))
    factor = _dev(g, v)  # (the blends take the uint8 image: uint8 - float is float, the same values)
    if name in ("Brightness", "BrightnessIncreasing"):  # blend with black
        return _to_uint8(img * factor)
    if name in ("Color", "ColorIncreasing", "Desaturate"):  # blend with PIL's grey (L) image
        return _blend(_luma(img), img, factor)
    if name in ("Contrast", "ContrastIncreasing"):  # blend with the rounded mean of the L image
        return _blend(_mean_grey(_luma(img)), img, factor)
    if name in ("Sharpness", "SharpnessIncreasing"):  # blend with PIL's SMOOTH filter, rounded
        return _blend(_smooth(g, img), img, factor)
    raise AssertionError(name)  # describe() admits only SUPPORTED names


def _autocontrast(img):
    """PIL's autocontrast per channel, ``(i - lo) * (255 / (hi - lo))`` truncated, the identity where
    hi == lo: ``(img - lo') * scale`` with lo' = lo (0 where hi == lo) and scale = 255 / (hi - lo) (1
    where hi == lo) looked up from hi - lo, so uint8 throughout until the product (img >= lo, so
    img - lo' does not wrap): the same float product as in float, in fewer operators."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    lo = fn.reductions.min(img, axis_names="HW", keep_dims=True)
    spread = fn.reductions.max(img, axis_names="HW", keep_dims=True) - lo
    scale = fn.lookup_table(spread, keys=list(range(256)),
                            values=[1.0] + [float(np.float32(255.0) / np.float32(d)) for d in range(1, 256)],
                            dtype=types.FLOAT, default_value=1.0)
    return _to_uint8((img - lo * (spread > types.Constant(0, dtype=types.UINT8))) * scale)


def _posterize_mask(g, op: dict, layer: dict):
    """``256 - 2 ** (8 - bits)`` as uint8 (saturated, as a cast of the float would be), bits being
    timm's level function of the sample's level: a number, or for a level per sample, one lookup by
    ``floor(4 * level)`` (the only per-sample part of every posterize level function)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    def mask(bits: float) -> int:
        return int(np.clip(np.rint(256.0 - 2.0 ** (8.0 - bits)), 0, 255))

    bits = {"Posterize": lambda f: f, "PosterizeIncreasing": lambda f: 4.0 - f,
            "PosterizeOriginal": lambda f: f + 4.0}[op["name"]]
    if "signed" not in layer and op["mstd"] == 0:
        return types.Constant(mask(bits(_floor(_level_of(op, layer) * 4.0))), dtype=types.UINT8)
    lv = _unsigned_level(op, layer)
    quarters = list(range(int(math.floor(op["upper"] / _LEVEL_DENOM * 4.0)) + 1))
    f = fn.cast(dmath.floor(lv * 4.0), dtype=types.INT32)
    return _dev(g, fn.lookup_table(f, keys=quarters, values=[mask(bits(float(q))) for q in quarters],
                                   dtype=types.UINT8, default_value=mask(bits(float(quarters[-1])))))


def _mean_grey(luma):
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath

    return dmath.floor(fn.reductions.mean(luma, axis_names="HW", keep_dims=True) + 0.5)


def _smooth(g, img):
    """PIL's SMOOTH filter, rounded, as float (of the uint8 image: DALI's filter computes in float)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    kernel = _const(g, [[1 / 13, 1 / 13, 1 / 13], [1 / 13, 5 / 13, 1 / 13], [1 / 13, 1 / 13, 1 / 13]])
    return dmath.floor(fn.filter(img, kernel, border="clamp", dtype=types.FLOAT) + 0.5)


def _blends(g, img, op: dict, layer: dict):
    """Colour, contrast, brightness and sharpness as one leaf: ``degenerate = luma * [Color] +
    mean grey * [Contrast] + smooth * [Sharpness]`` (0 for Brightness), each weight 1 for the op the
    sample drew and 0 otherwise, then PIL's blend with the shared factor: the single op's result to
    the bit (``v * 0 = 0``, ``v + 0 = v``). The candidates are the channels of one image (luma, mean
    grey, the smoothed R, G, B) and the weights one 3x5 ``coord_transform`` matrix per sample, looked
    up from its op index: one operator where three lookups, three copies to the device, three
    products and two sums were."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    # candidates: luma, mean grey, smooth R, G, B; each output channel takes one of them by the op
    rows = {"Color": [[1.0, 0, 0, 0, 0]] * 3, "Contrast": [[0, 1.0, 0, 0, 0]] * 3,
            "Sharpness": [[0, 0, 1.0, 0, 0], [0, 0, 0, 1.0, 0], [0, 0, 0, 0, 1.0]]}  # Brightness, the rest: 0
    names = [o["name"] for o in op["ops"]]
    table = [float(v) for name in names for row in rows.get(name.replace("Increasing", ""), [[0.0] * 5] * 3)
             for v in row]
    base = 15 * (len(names) + 1)  # the key: op index + len(names) + 1 (_layer)
    key = layer["key"] * 15 + types.Constant(np.arange(15, dtype=np.int32).reshape(3, 5))
    weights = fn.lookup_table(key, keys=list(range(base, base + len(table))), values=table, dtype=types.FLOAT,
                              default_value=0.0)
    luma = _luma(img)
    grey = _mean_grey(luma) + luma * 0.0  # (the mean over the image's pixels, as an image)
    candidates = fn.cat(luma, grey, _smooth(g, img), axis_name="C")
    degenerate = fn.coord_transform(candidates, M=weights, dtype=types.FLOAT)
    blend = next(o for o in op["ops"] if o["name"] in _BLENDS)
    return _blend(degenerate, img, _dev(g, _argument(blend, layer)))
