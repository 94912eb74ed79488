"""Input validation shared by the package: clear errors instead of silent NaNs or broadcasting, and the
checks every config dataclass runs at construction."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch


def as_float_tensor(x: Any, name: str) -> torch.Tensor:
    """``x`` as a floating tensor (keeps float64; ints, bools, lists and arrays become float32)."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    if not t.is_floating_point():
        t = t.to(torch.float32)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise a ValueError naming the first NaN/inf entry of ``t``."""
    bad = ~torch.isfinite(t)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} contains NaN or inf (first at index {idx}: {t[idx].item()})")


def check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_gamma(gamma: float, name: str = "gamma") -> float:
    gamma = float(gamma)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {gamma}")
    return gamma


# --------------------------------------------------------------------------- config dataclasses
#
# Every trainer's config calls ``check_config_types(self)`` first in its ``__post_init__``: each field is
# checked against its annotation (and normalised: numpy ints become int, ints become float in a float
# field, lists become tuples in a tuple field), so a wrong type fails at construction with one sentence
# naming ``Config.field`` instead of deep inside the trainer. The value rules (``positive`` etc.) come next.

_NONE = type(None)


def _describe(value: Any) -> str:
    """``str '8'``: the type and a (shortened) repr of a refused value."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _expected(tp: Any) -> str:
    """What an annotation asks for, in words: ``an int``, ``a number``, ``a tuple of int or None``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in args)
    if origin is typing.Literal:
        return f"one of {args}"
    if tp is _NONE or tp is None:
        return "None"
    if tp is int:
        return "an int"
    if tp is float:
        return "a number (int or float)"
    if tp is bool:
        return "a bool (True or False)"
    name = getattr(origin or tp, "__name__", str(tp))
    if origin in (tuple, list) and args:
        if len(args) == 1 or args[1] is Ellipsis:
            return f"a {name} of {getattr(args[0], '__name__', args[0])}"
        return f"a {name} of {len(args)} entries ({', '.join(getattr(a, '__name__', str(a)) for a in args)})"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def check_value(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against the annotation ``tp`` and normalised; TypeError/ValueError naming ``where``.

    int refuses bool, float and str (numpy ints become int); float takes ints and numpy numbers (made float)
    but not bool, str or NaN; bool and str take only their own type; ``X | None``, ``tuple[X, ...]`` (a list
    is made a tuple), ``list[X]``, ``Literal[...]`` and plain classes are understood; other annotations pass.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        options = [a for a in args if a is not _NONE]
        if len(options) == 1:  # ``X | None``: X's own message (it names the entry of a tuple, say)
            try:
                return check_value(value, options[0], where)
            except TypeError as e:
                if str(e).startswith(f"{where}["):  # a wrong entry of a tuple or list: its own message
                    raise
                raise TypeError(f"{where} must be {_expected(tp)}, got {_describe(value)}") from None
        for option in options:
            try:
                return check_value(value, option, where)
            except TypeError:
                continue
        raise TypeError(f"{where} must be {_expected(tp)}, got {_describe(value)}")
    if origin is typing.Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise ValueError(f"{where} must be one of {args}, got {value!r}")
    wrong = TypeError(f"{where} must be {_expected(tp)}, got {_describe(value)}")
    if tp is _NONE or tp is None:
        if value is None:
            return None
        raise wrong
    if tp is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise wrong
    if tp is int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        raise wrong
    if tp is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            value = float(value)
            if math.isnan(value):
                raise ValueError(f"{where} must be a number, not NaN")
            return value
        raise wrong
    if tp is str:
        if isinstance(value, str):
            return str(value)
        raise wrong
    if origin is tuple or tp is tuple:
        if not isinstance(value, (tuple, list)):
            raise wrong
        if not args:
            return tuple(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(check_value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{where} must have {len(args)} entries, got {len(value)}: {value!r}")
        return tuple(check_value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise wrong
        return [check_value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise wrong
        return value
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise wrong
    return value  # an annotation this checker does not know: leave the value alone


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)  # resolves the string annotations of ``from __future__ import annotations``
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name in hints}


def check_config_types(cfg: Any) -> None:
    """Check every field of the dataclass ``cfg`` against its annotation (see :func:`check_value`) and
    store the normalised value; the errors name ``ClassName.field``."""
    cls = type(cfg)
    for name, tp in _field_types(cls).items():
        value = check_value(getattr(cfg, name), tp, f"{cls.__name__}.{name}")
        object.__setattr__(cfg, name, value)  # object's setattr: frozen dataclasses too


def config_error(cfg: Any, name: str, must: str, why: str = "") -> ValueError:
    """``ValueError("GRPOConfig.beta must be >= 0, got -1.0")``, then ``: why`` if given."""
    text = f"{type(cfg).__name__}.{name} must be {must}, got {getattr(cfg, name)!r}"
    return ValueError(f"{text}: {why}" if why else text)


def _check_fields(cfg: Any, names: tuple[str, ...], ok: Callable[[Any], bool], must: str, finite: bool) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None:  # an optional setting left unset
            continue
        if finite and isinstance(value, float) and math.isinf(value):
            raise config_error(cfg, name, "finite")
        if not ok(value):
            raise config_error(cfg, name, must)


def positive(cfg: Any, *names: str, finite: bool = True) -> None:
    """Each named field (unless None) must be > 0 (and finite unless ``finite=False``)."""
    _check_fields(cfg, names, lambda v: v > 0, "> 0", finite)


def non_negative(cfg: Any, *names: str, finite: bool = True) -> None:
    """Each named field (unless None) must be >= 0 (and finite unless ``finite=False``)."""
    _check_fields(cfg, names, lambda v: v >= 0, ">= 0", finite)


def at_least(cfg: Any, minimum: int, *names: str) -> None:
    """Each named field (unless None) must be >= ``minimum``; for a tuple, each of its entries."""
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if v < minimum:
                    raise ValueError(f"{type(cfg).__name__}.{name}[{i}] must be >= {minimum}, got {v!r}")
        elif value is not None and value < minimum:
            raise config_error(cfg, name, f">= {minimum}")


def in_unit_interval(cfg: Any, *names: str) -> None:
    """Each named field (unless None) must be in [0, 1]."""
    _check_fields(cfg, names, lambda v: 0 <= v <= 1, "in [0, 1]", finite=False)


def one_of(cfg: Any, name: str, choices: Iterable[Any]) -> None:
    """The named field must be one of ``choices``."""
    choices = tuple(choices)
    if getattr(cfg, name) not in choices:
        raise config_error(cfg, name, f"one of {choices}")
