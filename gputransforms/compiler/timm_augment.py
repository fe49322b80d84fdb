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
conditionals (a binary split on the op index, as DALI's own auto_aug does).

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

from .chain import NotLowerable

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
# DALI runs each arithmetic operator of an expression as an operator of its own, and an operator
# costs about the same per batch whatever its size, so the graph computes what ops share once per
# layer, outside the branches (the signed level ``+-m / 10``, when the ops share their magnitude,
# as RandAugment's do), hands the branches as few nodes as it can (each node a branch reads is
# split at every level of the tree above it), keeps magnitudes without noise as Python numbers, and
# builds a shear's or translation's matrix as one constant combination.

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
        chosen, layer = _layer(g, a, draws, j, leaf_of)
        img = _switch(g, chosen, 0, len(leaves), img, leaves, layer)
    g.img = img


@_plain
def _leaves(ops: list) -> tuple:
    """The switch's leaves and, where they differ from ``ops``, each op's leaf (the identity last).
    The warps (rotation, shears, translations) are one leaf when they share interpolation, fill and
    magnitude: each sample's matrix is built before the switch (``_warps_matrix``), and one warp runs
    on the samples that chose any of them. A branch costs a few operators per level of the tree for
    each node it reads, and each operator costs about the same per batch whatever its size: five warp
    branches of two layers were 244 of timm RandAugment's 634 operators."""
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
            leaves.append(dict(op, name=name, names=[o["name"] for o in ops]))  # (each index's op)
        leaf_of.append(len(leaves) - 1 if name is None or i == groups[name][0] else leaf_of[groups[name][0]])
    return leaves, leaf_of + [len(leaves)]


@_plain
def _draws(a: dict) -> dict:
    """The random draws of all layers: the op index (or sub-policy), the coin, sign, magnitude noise."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    ops, shape = a["ops"], (a["layers"],)
    k = len(ops)
    if a["mode"] == "rand":
        if a["weights"] is not None:
            pick = fn.random.choice(k, p=a["weights"], shape=shape)
        else:
            pick = fn.random.uniform(values=list(range(k)), shape=shape, dtype=types.INT32)
    else:
        pick = fn.random.uniform(values=list(range(len(a["table"][0]))), dtype=types.INT32)
    noisy = [op for op in ops if op["mstd"] > 0]
    draws = dict(pick=pick, apply=fn.random.uniform(range=[0.0, 1.0], shape=shape),
                 sign=fn.cast(fn.random.coin_flip(probability=0.5, shape=shape), dtype=types.FLOAT) * -2.0 + 1.0)
    if any(not math.isinf(op["mstd"]) for op in noisy):
        draws["normal"] = fn.random.normal(shape=shape)
    if any(math.isinf(op["mstd"]) for op in noisy):
        draws["uniform"] = fn.random.uniform(range=[0.0, 1.0], shape=shape)  # magnitudes when mstd is infinite
    if any(op["name"] == "GaussianBlurRand" for op in ops):
        draws["blur"] = fn.random.uniform(range=[0.0, 1.0], shape=shape)
    return draws


@_plain
def _layer(g, a: dict, draws: dict, j: int, leaf_of):
    """Layer ``j``'s chosen leaf per sample (the last index: none) and the nodes its branches read."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    ops = a["ops"]
    k = len(ops)
    if a["mode"] == "rand":
        idx = draws["pick"][j]
    else:
        idx = fn.lookup_table(draws["pick"], keys=list(range(len(a["table"][j]))), values=a["table"][j],
                              dtype=types.INT32, default_value=k)
    layer = {key: node[j] for key, node in draws.items() if key != "pick"}
    coin = layer.pop("apply")
    if len({(op["magnitude"], op["mstd"], op["upper"]) for op in ops}) == 1:
        # one level for every op of the layer; the branches get only its signed copy
        # (each node a branch reads is split at every level of the tree above it)
        layer = dict(signed=_level_of(ops[0], layer) * layer["sign"],
                     **({"blur": layer["blur"]} if "blur" in layer else {}))
    probs = [op["prob"] for op in ops]
    if len(set(probs)) == 1:
        applied = coin < probs[0]
    else:
        p = fn.lookup_table(idx, keys=list(range(k)), values=probs, dtype=types.FLOAT, default_value=0.0)
        applied = coin < p
    on = fn.cast(applied, dtype=types.INT32)
    chosen = on * idx + (1 - on) * k  # k: not applied (or no op at this position)
    if leaf_of is None:
        return chosen, layer
    merged = [ops[i] for i in range(k) if leaf_of.count(leaf_of[i]) > 1]
    warp = next((op for op in merged if op["name"] in _GEOMETRIC), None)
    blend = next((op for op in merged if op["name"] in _BLENDS), None)
    if warp is not None:
        layer["matrix"] = _warps_matrix(g, ops, idx, _signed(warp, layer))
    if blend is not None:  # the blends' factor (they share it) and, inside the leaf, which degenerate
        layer["factor"], layer["idx"] = _argument(blend, layer), idx
    return fn.lookup_table(chosen, keys=list(range(k + 1)), values=leaf_of, dtype=types.INT32, default_value=k), layer


def _warps_matrix(g, ops: list, idx, s):
    """Each sample's inverse map for whichever warp ``idx`` names (identity for the other ops), from
    its signed level ``s``: a rotation by ``s * rot`` about the centre, plus ``s * shx`` and
    ``s * shy`` (shears) and ``s * tx`` and ``s * ty`` (translations) on their entries, with each
    op's factors looked up by index (zero for the others). For a single op this is the matrix of
    ``_warp_matrix`` to the bit (``cos 0 = 1``, ``sin 0 = 0``, ``x + 0 = x``)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    from .dali_scalars import as_float, is_node

    w, h = as_float(g.w), as_float(g.h)

    def table(value):
        vals = [float(value(op)) if op["name"] in _GEOMETRIC else 0.0 for op in ops]
        return fn.lookup_table(idx, keys=list(range(len(ops))), values=vals, dtype=types.FLOAT, default_value=0.0)

    def shift(rel: str, absolute: str, size):  # a translation's pixels per unit of level
        if is_node(size):
            pixels = table(lambda op: op["translate_pct"] if op["name"] == rel else 0.0) * size
        else:
            pixels = table(lambda op: size * op["translate_pct"] if op["name"] == rel else 0.0)
        if any(op["name"] == absolute for op in ops):
            pixels = pixels + table(lambda op: op["translate_const"] if op["name"] == absolute else 0.0)
        return pixels

    rad = s * table(lambda op: -30.0 * math.pi / 180.0 if op["name"] == "Rotate" else 0.0)
    c, n = dmath.cos(rad), dmath.sin(rad)
    keep = 1.0 - c
    cx, cy = w * 0.5, h * 0.5
    shx = table(lambda op: 0.3 if op["name"] == "ShearX" else 0.0)
    shy = table(lambda op: 0.3 if op["name"] == "ShearY" else 0.0)
    entries = [c, n + s * shx, keep * cx - n * cy + s * shift("TranslateXRel", "TranslateX", w),
               n * -1.0 + s * shy, c, keep * cy + n * cx + s * shift("TranslateYRel", "TranslateY", h)]
    return fn.reshape(fn.stack(*entries), shape=[2, 3])


def _switch(g, chosen, lo: int, hi: int, img, ops: list, layer: dict):
    """``ops[chosen]`` on each sample (``len(ops)``: the identity), by halving the index range with
    DALI's conditionals (a Python ``if`` on a node: the pipeline is traced with conditionals on)."""
    if lo == hi:
        return img if lo == len(ops) else _apply(g, img, ops[lo], layer)
    mid = (lo + hi) // 2
    if chosen <= mid:
        out = _switch(g, chosen, lo, mid, img, ops, layer)
    else:
        out = _switch(g, chosen, mid + 1, hi, img, ops, layer)
    return out


def _floor(x):
    import nvidia.dali.math as dmath

    from .dali_scalars import is_node

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
    import nvidia.dali.math as dmath

    from .dali_scalars import smax, smin

    name = op["name"]
    lv = dmath.abs(layer["signed"]) if "signed" in layer else _level_of(op, layer)
    if name == "Posterize":
        return _floor(lv * 4.0)
    if name == "PosterizeIncreasing":
        return 4.0 - _floor(lv * 4.0)
    if name == "PosterizeOriginal":
        return _floor(lv * 4.0) + 4.0
    if name == "Solarize":
        return smin(_floor(lv * 256.0), 256.0)
    if name == "SolarizeIncreasing":
        return 256.0 - smin(_floor(lv * 256.0), 256.0)
    if name == "SolarizeAdd":
        return smin(_floor(lv * 110.0), 128.0)
    if name.endswith("Increasing"):  # Color/Contrast/Brightness/Sharpness: 1 +- 0.9 level, at least 0.1
        return smax(_signed(op, layer) * 0.9 + 1.0, 0.1)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return lv * 1.8 + 0.1
    if name == "Desaturate":  # level in [0.5, 1]; the blend factor is 1 - level
        return 1.0 - smin(smax(lv * 0.5 + 0.5, 0.5), 1.0)
    if name == "GaussianBlur":
        return smin(smax(lv * 1.9 + 0.1, 0.1), 2.0)
    if name == "GaussianBlurRand":  # radius uniform in (0.1, 2 * level)
        return layer["blur"] * (smin(smax(lv, 0.0), 1.0) * 2.0 - 0.1) + 0.1
    return None  # AutoContrast, Equalize, Invert take no argument


def _signed(op: dict, layer: dict):
    if "signed" in layer:
        return layer["signed"]
    return layer["sign"] * _level_of(op, layer)


def _dev(g, x):
    """A per-sample number where the image is (a Python number stays one)."""
    from .dali_scalars import is_node

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


def _luma(g, x):
    """PIL's ``convert("L")`` of float RGB values: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath

    w = _const(g, [19595 / 65536, 38470 / 65536, 7471 / 65536])
    return dmath.floor(fn.reductions.sum(x * w, axis_names="C", keep_dims=True) + 0.5)


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
    f = _const(g, fill)
    x = fn.warp_affine(fn.cast(img, dtype=types.FLOAT) - f, matrix=matrix, fill_value=0.0, interp_type=interp,
                       inverse_map=True)
    return fn.cast(x + f, dtype=types.UINT8)  # (DALI's cast rounds, as PIL's bilinear filter does)


def _warp_matrix(g, op: dict, layer: dict):
    """The inverse map PIL's transform gets (s the signed level): ``v * E + I`` for a shear or a
    translation (E a unit matrix, v its one entry), and for a rotation about (w/2, h/2) PIL's
    ``[[cos a, sin a, t0], [-sin a, cos a, t1]]`` stacked from its entries; w and h are numbers, or
    nodes where the size is only known per sample."""
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath

    from .dali_scalars import as_float

    name, s = op["name"], _signed(op, layer)
    w, h = as_float(g.w), as_float(g.h)
    if name == "Rotate":  # PIL's Image.rotate by 30 * level degrees counter-clockwise: a = -radians(degrees)
        rad = s * (-30.0 * math.pi / 180.0)
        c, n = dmath.cos(rad), dmath.sin(rad)
        cx, cy = w * 0.5, h * 0.5
        keep = 1.0 - c  # (t0, t1) keep the centre in place
        entries = [c, n, keep * cx - n * cy, n * -1.0, c, keep * cy + n * cx]
        return fn.reshape(fn.stack(*entries), shape=[2, 3])
    if name in ("TranslateXRel", "TranslateYRel"):
        scale = (w if name == "TranslateXRel" else h) * op["translate_pct"]
    else:
        scale = op["translate_const"] if name in ("TranslateX", "TranslateY") else 0.3
    row = 0 if name in ("ShearX", "TranslateX", "TranslateXRel") else 1
    col = 2 if name.startswith("Translate") else 1 - row  # ShearX: x += v * y; ShearY: y += v * x
    unit = [[0.0] * 3 for _ in range(2)]
    unit[row][col] = 1.0
    v = s * scale
    return v * _const(g, unit, "cpu") + _const(g, [[1, 0, 0], [0, 1, 0]], "cpu")


@_plain
def _apply(g, img, op: dict, layer: dict):
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath
    import nvidia.dali.types as types

    from .dali_scalars import is_node, smax

    name = op["name"]
    if name == "Warps":  # the warps as one leaf: each sample's matrix is built before the switch
        return _warp(g, img, layer["matrix"], op)
    if name == "Blends":  # PIL's ImageEnhance ops as one leaf: a blend with the sample's own degenerate
        return _blends(g, img, op["names"], layer)
    if name in _GEOMETRIC:
        return _warp(g, img, _warp_matrix(g, op, layer), op)
    if name == "Invert":
        return types.Constant(255, dtype=types.UINT8) - img
    if name == "Equalize":
        return fn.equalize(img)
    if name == "AutoContrast":  # per channel: lut[i] = int((i - lo) * 255 / (hi - lo)), identity if hi == lo
        lo = fn.cast(fn.reductions.min(img, axis_names="HW", keep_dims=True), dtype=types.FLOAT)
        hi = fn.cast(fn.reductions.max(img, axis_names="HW", keep_dims=True), dtype=types.FLOAT)
        stretch = fn.cast(hi > lo, dtype=types.FLOAT)
        scale = stretch * (255.0 / dmath.max(hi - lo, 1.0)) + (1.0 - stretch)
        return _to_uint8((fn.cast(img, dtype=types.FLOAT) - lo * stretch) * scale)
    v = _argument(op, layer)
    if name.startswith("Posterize"):  # keep the top `bits` bits: & (256 - 2 ** (8 - bits))
        if not is_node(v):
            return img & types.Constant(int(256 - 2 ** (8 - int(v))), dtype=types.UINT8)
        return img & _dev(g, fn.cast(dmath.pow(2.0, 8.0 - v) * -1.0 + 256.0, dtype=types.UINT8))
    if name.startswith("Solarize") and name != "SolarizeAdd":  # i < thresh ? i : 255 - i
        below = img < _dev(g, v)
        return below * img + (below ^ True) * (types.Constant(255, dtype=types.UINT8) - img)
    if name == "SolarizeAdd":  # i < 128 ? min(255, i + add) : i
        below = img < types.Constant(128, dtype=types.UINT8)
        return fn.cast(img + below * _dev(g, v), dtype=types.UINT8)  # (the cast saturates at 255)
    if name in ("GaussianBlur", "GaussianBlurRand"):  # PIL's GaussianBlur(radius), radius as sigma
        return fn.gaussian_blur(img, sigma=smax(v, 0.1))
    x = fn.cast(img, dtype=types.FLOAT)
    factor = _dev(g, v)
    if name in ("Brightness", "BrightnessIncreasing"):  # blend with black
        return _to_uint8(x * factor)
    if name in ("Color", "ColorIncreasing", "Desaturate"):  # blend with PIL's grey (L) image
        return _blend(_luma(g, x), x, factor)
    if name in ("Contrast", "ContrastIncreasing"):  # blend with the rounded mean of the L image
        return _blend(_mean_grey(_luma(g, x)), x, factor)
    if name in ("Sharpness", "SharpnessIncreasing"):  # blend with PIL's SMOOTH filter, rounded
        return _blend(_smooth(g, x), x, factor)
    raise AssertionError(name)  # describe() admits only SUPPORTED names


def _mean_grey(luma):
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath

    return dmath.floor(fn.reductions.mean(luma, axis_names="HW", keep_dims=True) + 0.5)


def _smooth(g, x):
    import nvidia.dali.fn as fn
    import nvidia.dali.math as dmath

    kernel = _const(g, [[1 / 13, 1 / 13, 1 / 13], [1 / 13, 5 / 13, 1 / 13], [1 / 13, 1 / 13, 1 / 13]])
    return dmath.floor(fn.filter(x, kernel, border="clamp") + 0.5)


def _blends(g, img, names: list, layer: dict):
    """Colour, contrast, brightness and sharpness as one leaf: ``degenerate = luma * [Color] +
    mean grey * [Contrast] + smooth * [Sharpness]`` (0 for Brightness), each weight 1 for the op the
    sample drew and 0 otherwise (looked up from its op index), then PIL's blend with the shared
    factor: the single op's result to the bit (``v * 0 = 0``, ``v + 0 = v``)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    def weight(these):
        vals = [1.0 if name in these else 0.0 for name in names]
        return _dev(g, fn.lookup_table(layer["idx"], keys=list(range(len(names))), values=vals, dtype=types.FLOAT,
                                       default_value=0.0))

    x = fn.cast(img, dtype=types.FLOAT)
    luma = _luma(g, x)
    degenerate = (luma * weight({"Color", "ColorIncreasing"})
                  + _mean_grey(luma) * weight({"Contrast", "ContrastIncreasing"})
                  + _smooth(g, x) * weight({"Sharpness", "SharpnessIncreasing"}))
    return _blend(degenerate, x, _dev(g, layer["factor"]))
