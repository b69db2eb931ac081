"""Model FLOPs of one profiled operator from its recorded input shapes (`Input Dims`).

Formulas: 2·M·N·K for mm/addmm/linear/bmm/matmul; 4·B·H·L·S·E for attention forward
(halved when causal), twice that for its backward (model FLOPs: recompute not counted);
convolutions from shapes, stride, padding and dilation. An operator whose shapes or
arguments were not recorded gets None: unknown, never guessed.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Sequence
from typing import Any

Dims = Sequence[Sequence[int]]


def _prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def _mm(a: Sequence[int], b: Sequence[int]) -> float | None:
    """2·batch·M·K·N for matmul-style broadcasting of `a @ b`."""
    if not a or not b:
        return None
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    n = 1 if len(b) == 1 else b[-1]
    batch = max(_prod(a[:-2]) if len(a) > 2 else 1, _prod(b[:-2]) if len(b) > 2 else 1)
    return 2.0 * batch * m * k * n


def _concrete(args: dict[str, Any], i: int) -> Any:
    """The i-th `Concrete Inputs` value, parsed ('[2, 2]' -> [2, 2], 'True' -> True)."""
    values = args.get("Concrete Inputs")
    if not values or i >= len(values) or values[i] in ("", None):
        return None
    try:
        return ast.literal_eval(values[i])
    except (ValueError, SyntaxError):
        return values[i]


def _attention(dims: Dims, args: dict[str, Any], causal_at: int, factor: float) -> float | None:
    """factor·B·H·L·S·E from q [B,H,L,E] and k [B,H,S,E]; halved when causal."""
    if len(dims) < 2 or len(dims[0]) != 4 or len(dims[1]) != 4:
        return None
    b, h, lq, e = dims[0]
    s = dims[1][2]
    causal = _concrete(args, causal_at) is True
    return factor * b * h * lq * s * e / (2.0 if causal else 1.0)


def _attention_bwd(dims: Dims, args: dict[str, Any], causal_at: int) -> float | None:
    """Backward: grad_out first, then q, k: twice the forward's model FLOPs."""
    return _attention(dims[1:], args, causal_at, 8.0) if len(dims) > 2 else None


def _ints(value: Any, n: int, default: int) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return [value] * n
    if isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
        return list(value) * n if len(value) == 1 else list(value)
    return [default] * n if value == "valid" and default == 0 else None


def _conv(dims: Dims, args: dict[str, Any], at: tuple[int, int, int]) -> float | None:
    """2·N·O·prod(out spatial)·(C/g)·prod(kernel); stride, padding, dilation at `at`."""
    if len(dims) < 2 or len(dims[0]) < 3 or len(dims[1]) != len(dims[0]):
        return None
    if at[0] == 3 and _concrete(args, 6) is True:
        return None  # transposed: the output-size formula differs
    x, w = dims[0], dims[1]
    nsp = len(x) - 2
    stride = _ints(_concrete(args, at[0]), nsp, 1)
    pad = _ints(_concrete(args, at[1]), nsp, 0)
    dil = _ints(_concrete(args, at[2]), nsp, 1)
    if _concrete(args, at[1]) == "same":
        stride = [1] * nsp
        pad = [(d * (k - 1)) // 2 for d, k in zip(dil or [1] * nsp, w[2:], strict=True)]
    if stride is None or pad is None or dil is None:
        return None
    out = [
        (x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nsp)
    ]
    if min(out) <= 0:
        return None
    return 2.0 * x[0] * w[0] * _prod(out) * w[1] * _prod(w[2:])


def _conv_bwd(dims: Dims, args: dict[str, Any]) -> float | None:
    """grad_output gives the output size; one forward's worth per gradient computed."""
    if len(dims) < 3 or len(dims[0]) < 3 or len(dims[2]) != len(dims[0]):
        return None
    go, w = dims[0], dims[2]
    mask = _concrete(args, 10)
    grads = sum(bool(m) for m in mask[:2]) if isinstance(mask, list) else 2
    return grads * 2.0 * go[0] * w[0] * _prod(go[2:]) * w[1] * _prod(w[2:])


def _linear(dims: Dims) -> float | None:
    if len(dims) < 2 or not dims[0] or len(dims[1]) != 2:
        return None
    return 2.0 * _prod(dims[0][:-1]) * dims[0][-1] * dims[1][0]


Formula = Callable[[Dims, dict[str, Any]], float | None]

FORMULAS: dict[str, Formula] = {
    "aten::mm": lambda d, a: _mm(d[0], d[1]) if len(d) >= 2 else None,
    "aten::bmm": lambda d, a: _mm(d[0], d[1]) if len(d) >= 2 else None,
    "aten::matmul": lambda d, a: _mm(d[0], d[1]) if len(d) >= 2 else None,
    "aten::addmm": lambda d, a: _mm(d[1], d[2]) if len(d) >= 3 else None,
    "aten::_addmm_activation": lambda d, a: _mm(d[1], d[2]) if len(d) >= 3 else None,
    "aten::baddbmm": lambda d, a: _mm(d[1], d[2]) if len(d) >= 3 else None,
    "aten::linear": lambda d, a: _linear(d),
    "aten::scaled_dot_product_attention": lambda d, a: _attention(d, a, 5, 4.0),
    "aten::_scaled_dot_product_flash_attention": lambda d, a: _attention(d, a, 4, 4.0),
    "aten::_scaled_dot_product_efficient_attention": lambda d, a: _attention(d, a, 6, 4.0),
    "aten::_scaled_dot_product_cudnn_attention": lambda d, a: _attention(d, a, 6, 4.0),
    "aten::_scaled_dot_product_flash_attention_backward": lambda d, a: _attention_bwd(d, a, 11),
    "aten::_scaled_dot_product_efficient_attention_backward": (
        lambda d, a: _attention_bwd(d, a, 11)
    ),
    "aten::conv1d": lambda d, a: _conv(d, a, (3, 4, 5)),
    "aten::conv2d": lambda d, a: _conv(d, a, (3, 4, 5)),
    "aten::conv3d": lambda d, a: _conv(d, a, (3, 4, 5)),
    "aten::convolution": lambda d, a: _conv(d, a, (3, 4, 5)),
    "aten::_convolution": lambda d, a: _conv(d, a, (3, 4, 5)),
    "aten::cudnn_convolution": lambda d, a: _conv(d, a, (3, 2, 4)),
    "aten::miopen_convolution": lambda d, a: _conv(d, a, (4, 3, 5)),
    "aten::convolution_backward": _conv_bwd,
}


def op_flops(name: str, args: dict[str, Any]) -> tuple[float | None, bool]:
    """(FLOPs, estimated) of one op: the profiler's `flops` when recorded, else the formula."""
    counted = args.get("flops")
    if isinstance(counted, int | float) and counted > 0:
        return float(counted), False
    formula = FORMULAS.get(name)
    dims = args.get("Input Dims")
    if formula is None or not isinstance(dims, list):
        return None, True
    try:
        value = formula(dims, args)
    except (TypeError, ValueError, IndexError):
        return None, True
    return (value if value is not None and value > 0 else None), True


def has_formula(name: str) -> bool:
    """Whether FLOPs of this op can be counted at all."""
    return name in FORMULAS
