"""The config's field toolkit: pydantic field types that carry what they allow in words (`Int(1)`: "an integer
>= 1"), the strict Section every config section and component's settings derive from, and `check_model`, which
turns pydantic's first error into the one line a user reads (`train.epochs=abc: expected an integer >= 1`).
Imports no torch: every job checks its command line with it before anything heavy is imported."""

import json
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from pipeline.config import ConfigError

M = TypeVar("M", bound=BaseModel)
M_co = TypeVar("M_co", bound=BaseModel, covariant=True)


def show(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value.strip() and value == value.strip() else repr(value)
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str).replace('"', "")
    return str(value)


class Allowed:
    """What a field allows, in words, carried in its annotation for the error line."""

    def __init__(self, text: str):
        self.text = text


def field(base: Any, text: str, null: bool) -> Any:
    return Annotated[Optional[base] if null else base, Allowed(text + (" or null" if null else ""))]


def _bounds(ge=None, gt=None, le=None, lt=None) -> str:
    if ge is not None and (le is not None or lt is not None):
        return f" in [{ge}, {le if le is not None else lt}{']' if le is not None else ')'}"
    parts = [f"{op} {v}" for op, v in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if v is not None]
    return " " + " and ".join(parts) if parts else ""


def Int(ge: int | None = None, *, null: bool = False) -> Any:
    return field(Annotated[StrictInt, Field(ge=ge)], "an integer" + _bounds(ge=ge), null)


def Num(*, ge=None, gt=None, le=None, lt=None, null: bool = False) -> Any:
    # StrictFloat takes ints too (base_lr=1), but not strings or booleans
    return field(
        Annotated[StrictFloat, Field(ge=ge, gt=gt, le=le, lt=lt)],
        "a number" + _bounds(ge=ge, gt=gt, le=le, lt=lt),
        null,
    )


def Bool(*, null: bool = False) -> Any:
    return field(StrictBool, "true or false", null)


def Str(*, null: bool = False) -> Any:
    return field(Annotated[StrictStr, Field(min_length=1)], "a non-empty string", null)


def Choice(*values: Any, null: bool = False) -> Any:
    return field(Literal[values], "one of " + ", ".join(show(v) for v in values), null)


def Ints(ge: int | None = None, *, null: bool = False) -> Any:
    """A non-empty list of integers of any length (epochs, milestones)."""
    item = Annotated[StrictInt, Field(ge=ge)]
    return field(Annotated[list[item], Field(min_length=1)], "a non-empty list of integers" + _bounds(ge=ge), null)


def Nums(n: int, *, gt=None) -> Any:
    item = Annotated[StrictFloat, Field(gt=gt)]
    return field(
        Annotated[list[item], Field(min_length=n, max_length=n)], f"a list of {n} numbers" + _bounds(gt=gt), False
    )


class Section(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    def check(self, at: str) -> None:
        """Relations between this section's own keys that their types cannot say; ConfigError (`bad`) naming the
        key under `at`, the section's place in the config ("eval.knn"). pipeline.schema calls it on every section."""


def sections_of(node: BaseModel, at: str = "") -> list[tuple[str, "Section"]]:
    """Every section in a typed config, parents first, with its dotted place."""
    out: list[tuple[str, Section]] = [(at, node)] if isinstance(node, Section) else []
    for name in type(node).model_fields:
        child = getattr(node, name)
        if isinstance(child, BaseModel):
            out += sections_of(child, f"{at}.{name}" if at else name)
    return out


def bad(key: str, value: Any, allowed: str) -> ConfigError:
    """The one-line error for a key: `key=value: allowed`."""
    return ConfigError(f"{key}={show(value)}: {allowed}")


_MISSING = object()


def _get(data: dict, keys: list[str]) -> Any:
    """The value at `keys` in nested mappings, or _MISSING."""
    node: Any = data
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            return _MISSING
        node = node[k]
    return node


def _section_model(annotation: Any) -> type[BaseModel] | None:
    candidates = getattr(annotation, "__args__", None) or (annotation,)
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _model_at(model: type[BaseModel], loc: tuple) -> dict[str, Any]:
    """The fields of the (nested) section at `loc` less its last part: where an unknown key was written."""
    m: type[BaseModel] | None = model
    for part in loc[:-1]:
        info = m.model_fields.get(part) if m is not None and isinstance(part, str) else None
        m = _section_model(info.annotation) if info is not None else None
    return (m or model).model_fields


def check_model(model: type[M], data: dict, root: str = "", context: dict | None = None) -> M:
    """`data` validated against a section model, typed; ConfigError with one line naming the first bad key (prefixed
    with `root`, e.g. "sweep"), its value and what the field allows."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join([root] * bool(root) + [str(p) for p in err["loc"]])
        if err["type"] == "extra_forbidden":
            raise ConfigError(
                f"{where}: unknown key; expected one of {', '.join(_model_at(model, err['loc']))}"
            ) from None
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, ConfigError):  # a part's relation (its validator), its key relative to the part
            raise ConfigError(f"{where}.{inner}" if where else str(inner)) from None
        m: type[BaseModel] | None  # a section's model; None past the config keys
        keys, allowed, m = [], None, model
        for part in err["loc"]:  # the config keys of the location; union member tags and list indices end it
            if m is None or not isinstance(part, str) or part not in m.model_fields:
                break
            info = m.model_fields[part]
            keys.append(part)
            allowed = next((a.text for a in info.metadata if isinstance(a, Allowed)), None)
            m = _section_model(info.annotation)
            if m is not None:
                allowed = "a mapping of keys"
        key = ".".join([root] * bool(root) + keys) or root or "config"
        what = f"expected {allowed}" if allowed else err["msg"]
        value = _get(data, keys)
        if value is _MISSING:
            raise ConfigError(f"{key} is missing: {what}") from None
        raise bad(key, value, what) from None


@dataclass(frozen=True)
class Checked(Generic[M_co]):
    """A composed config its model passed: `typed`, what a job's typed objects (their `.of`) read, and `raw`, the
    config as composed, what a run records and hashes and where the sections whose keys are their components' own
    (the method's, the plug-ins', the recipe's) are read by those components. Made where a job starts; a job that
    completes its config afterwards (pipeline.train.prepare.resolve) makes a new one."""

    typed: M_co
    raw: dict[str, Any]

    @classmethod
    def of(cls, model: type[M], data: dict[str, Any], root: str = "") -> "Checked[M]":
        """`data` checked against `model` (check_model: ConfigError with one line), beside its typed form."""
        return Checked(check_model(model, data, root), data)
