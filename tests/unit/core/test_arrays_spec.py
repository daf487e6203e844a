"""core.arrays.spec: an array's arguments and each element's app (no services)."""

from __future__ import annotations

import json

import pytest

from core.arrays import is_array_id, split_element_id
from core.arrays.spec import ArraySpec, ArraySpecError, element_app, make_spec
from core.specs import AppDef, Role


def app(*args: str, **env: str) -> AppDef:
    return AppDef("sweep", [Role("w", entrypoint="train", args=list(args), env=dict(env))])


def test_size_elements_see_their_index() -> None:
    spec = make_spec(app("--shard", "${array_index}", "${replica_id}"), size=3, max_parallel=2)
    assert spec == ArraySpec(3, None, 2)
    role = element_app(app("--shard", "${array_index}", "${replica_id}"), spec, 2, "h").roles[0]
    # (the schedulers' own macros are left for them)
    assert role.args == ["--shard", "2", "${replica_id}"]
    assert role.env == {"SHIPYARD_ARRAY_INDEX": "2", "SHIPYARD_ARRAY_ID": "h"}


def test_params_elements_see_their_mapping() -> None:
    a = app("--lr=${params.lr}", "--name", "${params.name}", TAG="${params.name}-${array_index}")
    params = [{"lr": 0.1, "name": "a"}, {"lr": 1e-3, "name": "b b", "extra": [1, 2]}]
    spec = make_spec(a, params=params)
    assert spec.size == 2 and spec.max_parallel == 2
    role = element_app(a, spec, 1, "h").roles[0]
    assert role.args == ["--lr=0.001", "--name", "b b"]
    assert role.env["TAG"] == "b b-1"
    assert json.loads(role.env["SHIPYARD_ARRAY_PARAMS"]) == params[1]


def test_the_cap_is_at_most_the_size() -> None:
    assert make_spec(app(), size=2, max_parallel=10).max_parallel == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "size: expected the number of elements (or params), got neither"),
        ({"size": 0}, "size: expected a positive integer, got 0"),
        ({"size": -3}, "size: expected a positive integer, got -3"),
        ({"size": True}, "size: expected a positive integer, got True"),
        ({"size": 10**6}, "size: expected at most 100000 elements"),
        ({"size": 2, "params": [{}]}, "size, params: expected one of them, got both"),
        ({"params": {"a": 1}}, "params: expected a list of mappings"),
        ({"params": "ab"}, "params: expected a list of mappings"),
        ({"params": []}, "params: expected at least one mapping"),
        ({"params": [{"a": 1}, 3]}, "params[1]: expected a mapping with string keys, got 3"),
        ({"params": [{1: 2}]}, "params[0]: expected a mapping with string keys"),
        ({"params": [{"a": object()}]}, "params[0]: expected JSON values"),
        ({"size": 2, "max_parallel": 0}, "max_parallel: expected a positive integer, got 0"),
        ({"size": 2, "max_parallel": 1.5}, "max_parallel: expected a positive integer, got 1.5"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ArraySpecError) as err:
        make_spec(app(), **kwargs)
    assert message in str(err.value)


def test_a_param_macro_every_element_must_have() -> None:
    with pytest.raises(ValueError) as err:
        make_spec(app("${params.lr}"), params=[{"lr": 1}, {"rate": 2}])
    assert "element 1 has keys ['rate']" in str(err.value)
    with pytest.raises(ValueError, match=r"no params \(a size array\)"):
        make_spec(app(X="${params.lr}"), size=2)


def test_array_and_element_ids() -> None:
    assert is_array_id("sweep@0123abcd") and not is_array_id("sweep-0123abcd")
    assert split_element_id("sweep@0123abcd[12]") == ("sweep@0123abcd", 12)
    assert split_element_id("sweep@0123abcd") == ("sweep@0123abcd", None)
