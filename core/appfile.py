"""Apps as YAML: load an :class:`~core.specs.AppDef` from a file or text, and save one back.

A minimal app file::

    name: hello
    roles:
      - name: greeter
        entrypoint: echo
        args: ["hello", "from", "${replica_id}"]
        num_replicas: 2

The file is checked against a schema (:mod:`core.appschema`, pydantic models; ``shipyard
schema`` prints it as JSON Schema). Every error is reported at once, each naming the path of the
bad field and, for a file, where it is::

    app.yaml:9:19: roles[1].num_replicas: expected a positive integer, got -2
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import yaml

from core.errors import ShipyardError
from core.specs import AppDef, BindMount, DeviceMount, VolumeMount, validate_app

__all__ = [
    "AppFileError",
    "AppFileIssue",
    "app_from_dict",
    "app_from_yaml",
    "app_json_schema",
    "app_to_dict",
    "dump_app",
    "load_app",
]

#: at most this many issues are listed in an :class:`AppFileError`'s message
MAX_LISTED = 20


@dataclass(frozen=True)
class AppFileIssue:
    """One thing wrong with an app file.

    Args:
        path: the bad field, e.g. ``roles[1].num_replicas`` (``app`` for the whole app; empty
            for a file that is not YAML at all)
        message: what was expected, e.g. ``expected a positive integer, got -2``
        source: the file (or ``<string>``) where known
        line: 1-based line of the bad value (or of its mapping, for a missing field)
        column: 1-based column
    """

    path: str
    message: str
    source: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source if self.line is None else f"{self.source}:{self.line}"
            where += "" if self.line is None or self.column is None else f":{self.column}"
            where += ": "
        return f"{where}{self.path}: {self.message}" if self.path else f"{where}{self.message}"


class AppFileError(ShipyardError, ValueError):
    """An app file or dict that does not describe a valid app.

    ``issues`` lists everything wrong (at least one); the message has one line per issue (up to
    :data:`MAX_LISTED`), the first line being the first issue.
    """

    def __init__(self, issues: list[AppFileIssue] | str) -> None:
        if isinstance(issues, str):
            issues = [AppFileIssue("", issues)]
        self.issues: tuple[AppFileIssue, ...] = tuple(issues)
        lines = [str(i) for i in self.issues[:MAX_LISTED]]
        if len(self.issues) > MAX_LISTED:
            lines.append(f"... and {len(self.issues) - MAX_LISTED} more errors")
        super().__init__("\n".join(lines))


def _node_at(
    root: yaml.Node | None, loc: tuple[str | int, ...], at_key: bool = False
) -> yaml.Node | None:
    """The YAML node of the value at ``loc`` (pydantic's path; ``at_key``: of its key), or of
    the deepest mapping or list on the way that holds it (a missing field: the mapping)."""
    node, key = root, None
    for part in loc:
        if part == "[key]":  # the key itself is bad
            return key or node
        key = None
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                break
            node = node.value[part]
        elif isinstance(node, yaml.MappingNode):
            found = [
                (k, v)
                for k, v in node.value
                if isinstance(k, yaml.ScalarNode) and k.value == str(part)
            ]
            if not found:
                break
            key, node = found[-1]
        else:
            break
    return key if at_key and key is not None else node


def app_from_dict(data: Any, source: str | None = None, root: yaml.Node | None = None) -> AppDef:
    """Builds and validates an :class:`AppDef` from plain data (as loaded from YAML or JSON).

    ``source`` and ``root`` (the YAML node ``data`` was constructed from) place each issue in
    its file.

    Raises:
        AppFileError: (a ``ValueError``) listing every bad field found, each with its path.
    """
    from core import appschema  # pydantic: only once an app is read

    spec, problems = appschema.check(data)
    if spec is None:
        issues = []
        for p in problems:
            node = _node_at(root, p.loc, at_key=p.kind == "extra_forbidden")
            mark = None if node is None else node.start_mark
            issues.append(
                AppFileIssue(
                    p.path,
                    p.message,
                    source,
                    None if mark is None else mark.line + 1,
                    None if mark is None else mark.column + 1,
                )
            )
        # in the order of the file where known (pydantic's is the order of the fields)
        issues.sort(key=lambda i: (i.line is None, i.line or 0, i.column or 0))
        raise AppFileError(issues)
    app = spec.to_app()
    try:
        validate_app(app)  # the scheduler-side check: should pass, as the schema is stricter
    except ValueError as e:
        path, _, message = str(e).partition(": ")
        raise AppFileError([AppFileIssue(path, message, source)]) from None
    return app


def _parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """``yaml.safe_load`` that also returns the document's node (its marks give lines)."""
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # reads the first characters already
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), node
    except RecursionError:
        raise AppFileError([AppFileIssue("", "invalid YAML: nested too deeply", source)]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise AppFileError(
            [
                AppFileIssue(
                    "",
                    f"invalid YAML: {problem}",
                    source,
                    None if mark is None else mark.line + 1,
                    None if mark is None else mark.column + 1,
                )
            ]
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def app_from_yaml(text: str, source: str = "<string>") -> AppDef:
    """Parses YAML text into an :class:`AppDef` (``source`` names it in errors).

    Raises:
        AppFileError: for invalid YAML, or listing every bad field with its line.
    """
    data, root = _parse_yaml(text, source)
    return app_from_dict(data, source, root)


def load_app(path_or_text: str | os.PathLike[str]) -> AppDef:
    """Loads an app from a YAML file path, or from YAML text when given text with a newline.

    Raises:
        AppFileError: for a missing file, invalid YAML, or an invalid app (naming each field).
    """
    s = os.fspath(path_or_text)
    if "\n" in s:
        return app_from_yaml(s)
    try:
        with open(s, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise AppFileError(f"app file: cannot read {s!r}: {e.strerror}") from None
    except ValueError as e:  # a NUL in the path, or not UTF-8
        raise AppFileError(f"app file: cannot read {s!r}: {e}") from None
    return app_from_yaml(text, source=s)


def app_json_schema() -> dict[str, Any]:
    """The JSON Schema of app files (``shipyard schema``), e.g. for a YAML language server."""
    from core import appschema

    return appschema.json_schema()


def _mount_str(m: BindMount | VolumeMount | DeviceMount) -> str:
    if isinstance(m, BindMount):
        return f"type=bind,src={m.src_path},dst={m.dst_path}" + (",readonly" if m.read_only else "")
    if isinstance(m, VolumeMount):
        return f"type=volume,src={m.src},dst={m.dst_path}" + (",readonly" if m.read_only else "")
    return f"type=device,src={m.src_path},dst={m.dst_path},permissions={m.permissions}"


def app_to_dict(app: AppDef) -> dict[str, Any]:
    """The plain-data form of ``app`` that :func:`app_from_dict` reads back."""
    roles = []
    for r in app.roles:
        role: dict[str, Any] = {
            "name": r.name,
            "image": r.image,
            "entrypoint": r.entrypoint,
            "args": list(r.args),
            "env": dict(r.env),
            "num_replicas": r.num_replicas,
            "max_retries": r.max_retries,
            "retry_policy": r.retry_policy.value,
            "resource": {
                "cpu": r.resource.cpu,
                "gpu": r.resource.gpu,
                "memMB": r.resource.memMB,
                "capabilities": dict(r.resource.capabilities),
                "devices": dict(r.resource.devices),
            },
            "port_map": dict(r.port_map),
            "metadata": dict(r.metadata),
            "mounts": [_mount_str(m) for m in r.mounts],
        }
        if r.base_image is not None:
            role["base_image"] = r.base_image
        if r.min_replicas is not None:
            role["min_replicas"] = r.min_replicas
        roles.append(role)
    return {"name": app.name, "roles": roles, "metadata": dict(app.metadata)}


def dump_app(app: AppDef) -> str:
    """``app`` as YAML text."""
    return yaml.safe_dump(app_to_dict(app), sort_keys=False)
