"""The app-file schema: pydantic models of an app file, and its errors in Shipyard's words.

:mod:`core.appfile` reads YAML and imports this module only when it validates an app (pydantic
takes ~100 ms to import: ``import core`` and the inline ``shipyard run -- CMD`` never pay it).

Validation reports every error at once (:func:`check`), each as a :class:`SchemaIssue` with the
path of the bad field and a message in the form ``expected <what>, got <value>``; the same
models give the JSON Schema of app files (:func:`json_schema`, ``shipyard schema``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from core.durations import DURATION_FORMS, parse_duration
from core.errors import short_repr
from core.specs import (
    ENV_KEY_PATTERN,
    MAX_REPLICAS,
    NAME_PATTERN,
    AppDef,
    Resource,
    RetryPolicy,
    Role,
    get_named_resources,
    named_resources,
    parse_mounts,
)

__all__ = [
    "AppSpec",
    "MountSpec",
    "ResourceSpec",
    "RoleSpec",
    "SchemaIssue",
    "check",
    "json_schema",
]

#: the ``type`` of the errors this module words itself (pydantic's own ones are reworded)
ERROR_TYPE = "shipyard"


def _error(message: str, sub: str = "", **context: Any) -> PydanticCustomError:
    """An error in Shipyard's words; ``sub`` extends the field's path (``.min_replicas``)."""
    return PydanticCustomError(ERROR_TYPE, message, {"sub": sub, **context})


def _expect(what: str) -> WrapValidator:
    """Rewords pydantic's own error for the value itself as ``expected <what>, got <value>``;
    errors of items inside it, and errors already in Shipyard's words, pass unchanged."""

    def reword(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as e:
            if any(not err["loc"] and err["type"] != ERROR_TYPE for err in e.errors()):
                raise _error(
                    "expected {expected}, got {got}", expected=what, got=short_repr(value)
                ) from None
            raise

    return WrapValidator(reword)


def _scalar_to_str(value: Any) -> Any:
    # YAML turns `10` and `true` into numbers and bools; args and env are strings to a process.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise _error("must not contain NUL characters")
    return value


def _none_to(empty: Callable[[], Any]) -> BeforeValidator:
    """``null`` (an empty YAML value) reads as the field's empty default."""
    return BeforeValidator(lambda v: empty() if v is None else v)


_SCALAR = str | int | float | bool
#: a string; numbers and booleans are read as their YAML text (``10``, ``true``)
Text = Annotated[
    str,
    Field(strict=True),
    BeforeValidator(_scalar_to_str, json_schema_input_type=_SCALAR),
    _expect("a string"),
    AfterValidator(_no_nul),
]
Name = Annotated[
    str,
    Field(strict=True, pattern=f"^{NAME_PATTERN}$"),
    BeforeValidator(_scalar_to_str),
    _expect("1-63 characters of letters, digits, '_', '.', '-' starting with a letter or digit"),
]
EnvKey = Annotated[
    str,
    Field(strict=True, pattern=f"^{ENV_KEY_PATTERN}$"),
    _expect("variable names of letters, digits and '_'"),
]
Key = Annotated[str, Field(strict=True), BeforeValidator(_scalar_to_str), _expect("a string key")]
PositiveInt = Annotated[int, Field(strict=True, ge=1), _expect("a positive integer")]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0), _expect("a non-negative integer")]
ResourceCount = Annotated[int, Field(strict=True, ge=-1), _expect("an integer >= -1")]
Port = Annotated[int, Field(strict=True, ge=1, le=65535), _expect("a port 1-65535")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourceSpec(_Strict):
    """What each replica asks for; -1 (the default) leaves it to the scheduler."""

    cpu: Annotated[ResourceCount, Field(description="logical CPU cores")] = -1
    gpu: Annotated[ResourceCount, Field(description="GPUs")] = -1
    memMB: Annotated[ResourceCount, Field(description="memory in MiB")] = -1  # noqa: N815 - the spec's name
    capabilities: Annotated[dict[Key, Any], _none_to(dict), _expect("a mapping")] = Field(
        default_factory=dict, description="scheduler-specific capabilities"
    )
    devices: Annotated[
        dict[Key, NonNegativeInt],
        _none_to(dict),
        _expect("a mapping of device names to counts"),
    ] = Field(default_factory=dict, description="named devices and how many of each")

    def to_resource(self) -> Resource:
        """The :class:`~core.specs.Resource` this describes."""
        return Resource(
            cpu=self.cpu,
            gpu=self.gpu,
            memMB=self.memMB,
            capabilities=dict(self.capabilities),
            devices=dict(self.devices),
        )


def _preset(value: Any) -> Any:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            return asdict(get_named_resources(value))
        except ValueError as e:  # "resource: unknown named resource ...": drop the prefix
            raise _error("{detail}", detail=str(e).partition(": ")[2]) from None
    return value


_PRESETS: Any = Literal[tuple(named_resources)]  # type: ignore[valid-type]


class MountSpec(_Strict):
    """A mount written as a mapping (or as ``type=bind,src=/a,dst=/b,readonly``)."""

    type: Literal["bind", "volume", "device"]
    src: str = Field(description="host path (bind, device) or volume name (volume)")
    dst: str | None = Field(None, description="path in the replica (a device: default src)")
    readonly: bool = False
    permissions: str | None = Field(None, description="a device's permissions: letters of rwm")


def _mount_to_str(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    # joined into one option string: a comma in a value would start another option (or
    # another mount), so a value cannot contain one
    for k, v in value.items():
        if not isinstance(k, str):
            raise _error("expected option names (strings), got {got}", got=short_repr(k))
        if isinstance(v, str) and "," in v:
            raise _error("expected a value without ',', got {got}", sub=f".{k}", got=short_repr(v))
    return ",".join(k if v is True else f"{k}={v}" for k, v in value.items() if v is not False)


def _parse_mount(value: str) -> str:
    try:
        parse_mounts([value])
    except ValueError as e:  # "mounts[0].type: expected ...": the path is ours to give
        head, _, detail = str(e).partition(": ")
        sub = head.split("]", 1)[1] if "]" in head else ""
        raise _error("{detail}", sub=sub, detail=detail) from None
    return value


Mount = Annotated[
    str,
    Field(strict=True),
    BeforeValidator(_mount_to_str, json_schema_input_type=str | MountSpec),
    _expect("'type=bind,src=...,dst=...' or a mapping"),
    AfterValidator(_parse_mount),
]


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


_POLICIES = [p.value for p in RetryPolicy]


def _max_replicas(n: int) -> int:
    if n > MAX_REPLICAS:
        raise _error(
            "expected at most {most} replicas per role, got {got}", most=MAX_REPLICAS, got=n
        )
    return n


class RoleSpec(_Strict):
    """One role: ``num_replicas`` copies of the same command."""

    name: Name
    entrypoint: Annotated[
        str,
        Field(strict=True, min_length=1),
        BeforeValidator(_scalar_to_str),
        _expect("a non-empty command"),
        AfterValidator(_no_nul),
    ] = Field(description="the command to run")
    image: Text = Field("", description="a directory (local_dir) or a Docker image")
    base_image: Text | None = None
    args: Annotated[list[Text], _none_to(list), _expect("a list of strings")] = Field(
        default_factory=list, description="arguments; macros such as ${replica_id} are replaced"
    )
    env: Annotated[
        dict[EnvKey, Text],
        _none_to(dict),
        _expect("a mapping of strings"),
        WithJsonSchema(
            {
                "type": "object",
                "propertyNames": {"pattern": f"^{ENV_KEY_PATTERN}$"},
                "additionalProperties": {"type": ["string", "number", "boolean"]},
            }
        ),
    ] = Field(default_factory=dict, description="environment variables")
    num_replicas: Annotated[PositiveInt, AfterValidator(_max_replicas)] = Field(
        1, json_schema_extra={"maximum": MAX_REPLICAS}
    )
    min_replicas: PositiveInt | None = None
    max_retries: NonNegativeInt = 0
    retry_policy: Annotated[
        RetryPolicy,
        BeforeValidator(_upper),
        _expect(f"one of {_POLICIES}"),
        WithJsonSchema({"enum": [*_POLICIES, *(p.lower() for p in _POLICIES)]}),
    ] = RetryPolicy.APPLICATION
    resource: Annotated[
        ResourceSpec,
        BeforeValidator(_preset, json_schema_input_type=_PRESETS | ResourceSpec),
        _expect("a mapping or a named resource"),
    ] = Field(default_factory=lambda: ResourceSpec(), description="a mapping, or a preset's name")
    port_map: Annotated[dict[Key, Port], _none_to(dict), _expect("a mapping of names to ports")] = (
        Field(default_factory=dict)
    )
    metadata: Annotated[dict[Key, Any], _none_to(dict), _expect("a mapping")] = Field(
        default_factory=dict
    )
    mounts: Annotated[list[Mount], _none_to(list), _expect("a list of mounts")] = Field(
        default_factory=list
    )

    @model_validator(mode="after")
    def _min_at_most_num(self) -> RoleSpec:
        if self.min_replicas is not None and self.min_replicas > self.num_replicas:
            raise _error(
                "expected at most num_replicas ({num}), got {got}",
                sub=".min_replicas",
                num=self.num_replicas,
                got=self.min_replicas,
            )
        return self

    def to_role(self) -> Role:
        """The :class:`~core.specs.Role` this describes."""
        return Role(
            name=self.name,
            image=self.image,
            base_image=self.base_image,
            entrypoint=self.entrypoint,
            args=list(self.args),
            env=dict(self.env),
            num_replicas=self.num_replicas,
            min_replicas=self.min_replicas,
            max_retries=self.max_retries,
            retry_policy=self.retry_policy,
            resource=self.resource.to_resource(),
            port_map=dict(self.port_map),
            metadata=dict(self.metadata),
            mounts=parse_mounts(self.mounts) if self.mounts else [],
        )


class AppSpec(_Strict):
    """A Shipyard app file: one or more roles."""

    model_config = ConfigDict(
        title="Shipyard app",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    name: Name = Field(description="the app's name (letters, digits, '_', '.', '-')")
    roles: Annotated[list[RoleSpec], Field(min_length=1), _expect("a non-empty list of roles")] = (
        Field(description="the roles; each runs num_replicas copies of its command")
    )
    metadata: Annotated[dict[Key, Text], _none_to(dict), _expect("a mapping of strings")] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _unique_role_names(self) -> AppSpec:
        seen: set[str] = set()
        for i, role in enumerate(self.roles):
            if role.name in seen:
                raise _error(
                    "duplicate role name {got}", sub=f"roles[{i}].name", got=short_repr(role.name)
                )
            seen.add(role.name)
        return self

    @field_validator("metadata")
    @classmethod
    def _max_silence_is_a_duration(cls, metadata: dict[str, str]) -> dict[str, str]:
        raw = metadata.get("max_silence")
        try:
            if raw is not None:
                parse_duration(raw, "metadata.max_silence")
        except ValueError:
            raise _error(
                "expected a positive duration such as {forms}, got {got}",
                sub=".max_silence",
                forms=DURATION_FORMS,
                got=short_repr(raw),
            ) from None
        return metadata

    def to_app(self) -> AppDef:
        """The :class:`~core.specs.AppDef` this describes."""
        return AppDef(
            name=self.name,
            roles=[r.to_role() for r in self.roles],
            metadata=dict(self.metadata),
        )


@dataclass(frozen=True)
class SchemaIssue:
    """One thing wrong with an app: where (``loc``, pydantic's path; ``path``, as written in
    messages, e.g. ``roles[1].num_replicas``), what (``message``) and pydantic's error type
    (``kind``: ``extra_forbidden`` for an unknown field, ``missing``, or ``shipyard``)."""

    loc: tuple[str | int, ...]
    path: str
    message: str
    kind: str = ERROR_TYPE

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _path(data: Any, loc: Sequence[str | int]) -> str:
    """``loc`` as written in messages: ``roles[1].env`` (a dict key's own error names the dict)."""
    out = ""
    cur = data
    for i, part in enumerate(loc):
        if part == "[key]" or (i + 1 < len(loc) and loc[i + 1] == "[key]"):
            break
        if isinstance(cur, list) and isinstance(part, int):
            out += f"[{part}]"
            cur = cur[part] if 0 <= part < len(cur) else None
        else:
            if isinstance(part, str) and len(part) <= 64 and _PLAIN_KEY.fullmatch(part):
                out += f".{part}" if out else part
            else:  # a key that would read as something else: quoted
                out += f"[{short_repr(part)}]"
            cur = cur.get(part) if isinstance(cur, Mapping) else None
    return out


def _fields_at(loc: Sequence[str | int]) -> list[str]:
    """The field names of the model at ``loc`` (the app, a role or a resource)."""
    model: type[BaseModel] = AppSpec
    for part in loc:
        if part == "roles":
            model = RoleSpec
        elif part == "resource":
            model = ResourceSpec
    return list(model.model_fields)


def _issue(data: Any, err: Mapping[str, Any]) -> SchemaIssue:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    path = _path(data, loc)
    if kind == ERROR_TYPE:
        sub = str(ctx.get("sub", ""))
        path = (path + sub) if path else sub.lstrip(".")
        message = err["msg"]
    elif kind == "missing":
        message = "required"
    elif kind == "extra_forbidden":
        message = f"unknown field; expected one of {', '.join(_fields_at(loc[:-1]))}"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        message = f"expected a mapping, got {short_repr(err.get('input'))}"
    else:  # not expected: every field words its own errors; keep pydantic's
        message = f"{err['msg']}, got {short_repr(err.get('input'))}"
    return SchemaIssue(loc, path or "app", message, kind)


def check(data: Any) -> tuple[AppSpec | None, list[SchemaIssue]]:
    """Validates app-file data (as loaded from YAML or JSON).

    Returns:
        The validated :class:`AppSpec` and no issues, or ``None`` and every issue found.
    """
    try:
        return AppSpec.model_validate(data), []
    except ValidationError as e:
        return None, [_issue(data, err) for err in e.errors(include_url=False)]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of app files (draft 2020-12), for editors and YAML language servers."""
    return AppSpec.model_json_schema()
