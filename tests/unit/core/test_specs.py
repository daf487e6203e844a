from __future__ import annotations

import pytest

from core import specs
from core.specs import (
    NULL_RESOURCE,
    AppDef,
    AppDryRunInfo,
    AppState,
    AppStatus,
    BindMount,
    DeviceMount,
    MalformedAppHandleException,
    ReplicaStatus,
    Resource,
    RetryPolicy,
    Role,
    RoleStatus,
    VolumeMount,
    get_named_resources,
    is_terminal,
    macros,
    make_app_handle,
    named_resources,
    parse_app_handle,
    parse_mounts,
    resource,
    runopts,
    validate_app,
)


def _app(**role_kw: object) -> AppDef:
    kw: dict[str, object] = {"name": "r", "entrypoint": "echo"}
    kw.update(role_kw)
    return AppDef("app", [Role(**kw)])  # type: ignore[arg-type]


def test_every_public_name_exists() -> None:
    for name in specs.__all__:
        assert hasattr(specs, name), name


def test_app_state_terminal() -> None:
    assert [s for s in AppState if is_terminal(s)] == [
        AppState.SUCCEEDED,
        AppState.FAILED,
        AppState.CANCELLED,
    ]
    assert str(AppState.RUNNING) == "RUNNING"
    assert AppState.UNSUBMITTED == 0 and AppState.UNKNOWN == 7


def test_resources_and_presets() -> None:
    assert resource(cpu=2).cpu == 2 and resource(cpu=2).memMB == 1024
    assert resource(h="small") == get_named_resources("small")
    assert "medium" in named_resources and named_resources["MEDIUM"].cpu == 2
    a = named_resources["tiny"]
    a.cpu = 99
    assert named_resources["tiny"].cpu == 1, "presets must be fresh copies"
    with pytest.raises(ValueError, match="unknown named resource 'huge'"):
        get_named_resources("huge")
    c = Resource.copy(Resource(1, 0, 10, {"a": 1}), b=2)
    assert c.capabilities == {"a": 1, "b": 2}
    assert NULL_RESOURCE.cpu == -1


def test_macros_substitute_args_and_env() -> None:
    role = Role(
        "r",
        entrypoint="run",
        args=[macros.app_id, f"--rank={macros.replica_id}", "${unknown}"],
        env={"ROOT": macros.img_root, "MASTER": f"${{{macros.rank0_env[2:-1]}}}"},
    )
    values = macros.Values(img_root="/img", app_id="a-1", replica_id="3", rank0_env="MASTER_ADDR")
    out = values.apply(role)
    assert out.args == ["a-1", "--rank=3", "${unknown}"]
    assert out.env["ROOT"] == "/img"
    assert out.env["MASTER"] == "MASTER_ADDR"
    assert role.args[0] == macros.app_id, "apply must not modify the original role"
    # shell syntax is not a macro: $$, $VAR and ${VAR} reach the program as written
    assert values.substitute("echo $$ $HOME ${HOME} $${app_id}") == "echo $$ $HOME ${HOME} $a-1"


def test_parse_mounts_all_kinds() -> None:
    mounts = parse_mounts(
        [
            "type=bind,src=/a,dst=/b,readonly",
            "type=volume,src=vol,dst=/data",
            "type=device,src=/dev/fuse",
            "type=device,src=/dev/x,dst=/dev/y,perm=r",
        ]
    )
    assert mounts == [
        BindMount("/a", "/b", True),
        VolumeMount("vol", "/data", False),
        DeviceMount("/dev/fuse", "/dev/fuse", "rwm"),
        DeviceMount("/dev/x", "/dev/y", "r"),
    ]
    # comma-split tokens as a CLI gives them
    assert parse_mounts(["type=bind", "src=/a", "dst=/b"]) == [BindMount("/a", "/b")]


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("src=/a,dst=/b", "must start with type="),
        ("type=nfs,src=/a,dst=/b", r"mounts\[0\].type: expected bind, volume or device"),
        ("type=bind,dst=/b", r"mounts\[0\].src: required"),
        ("type=bind,src=/a", r"mounts\[0\].dst: required"),
        ("type=bind,src=/a,dst=/b,color=red", "unknown key 'color'"),
        ("type=device,src=/d,perm=rwx", "permissions: expected letters of 'rwm'"),
        ("type=bind,src=/a,dst=/b,junk", "expected key=value"),
    ],
)
def test_parse_mounts_errors(spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        parse_mounts(spec)


def test_validate_app_accepts_good_app() -> None:
    validate_app(_app(num_replicas=3, env={"A_B": "1"}, port_map={"http": 80}))


@pytest.mark.parametrize(
    "app,msg",
    [
        (AppDef("x", []), "roles: expected at least one role"),
        (AppDef("bad name", [Role("r", entrypoint="e")]), "name: expected 1-63 characters"),
        (AppDef("x", [Role("r/../x", entrypoint="e")]), r"roles\[0\].name"),
        (
            AppDef("x", [Role("a", entrypoint="e"), Role("a", entrypoint="e")]),
            r"roles\[1\].name: duplicate",
        ),
        (_app(num_replicas=0), r"roles\[0\].num_replicas: expected a positive integer, got 0"),
        (_app(num_replicas=-2), "got -2"),
        (_app(num_replicas=True), "num_replicas"),
        (_app(entrypoint=""), r"roles\[0\].entrypoint"),
        (_app(args=["ok", 3]), r"roles\[0\].args\[1\]: expected a string"),
        (_app(env={"BAD-KEY": "x"}), r"roles\[0\].env: expected variable names"),
        (_app(env={"K": 1}), r"roles\[0\].env.K: expected a string"),
        (_app(max_retries=-1), "max_retries: expected a non-negative integer"),
        (_app(min_replicas=5, num_replicas=2), "min_replicas: expected at most num_replicas"),
        (_app(port_map={"p": 70000}), "port_map.p: expected a port"),
        (_app(resource=Resource(cpu=-5, gpu=0, memMB=1)), "resource.cpu"),
        (_app(args=["a\x00b"]), "NUL"),
    ],
)
def test_validate_app_errors_name_the_field(app: AppDef, msg: str) -> None:
    with pytest.raises(ValueError, match=msg) as e:
        validate_app(app)
    assert "\n" not in str(e.value)


def test_runopts_resolve_defaults_types_and_errors() -> None:
    opts = runopts()
    opts.add("log_dir", type_=str, help="where logs go")
    opts.add("count", type_=int, help="how many", default=2)
    opts.add("flag", type_=bool, help="a flag", default=False)
    opts.add("ratio", type_=float, help="a ratio", default=0.5)
    opts.add("pats", type_=list[str], help="patterns")
    opts.add("env", type_=dict[str, str], help="env")
    opts.add("part", type_=str, help="partition", required=True)
    assert opts.resolve({"part": "debug"}) == {
        "log_dir": None,
        "count": 2,
        "flag": False,
        "ratio": 0.5,
        "pats": None,
        "env": None,
        "part": "debug",
    }
    r = opts.resolve(
        {"part": "p", "count": "7", "flag": "true", "ratio": 1, "pats": "A*,B*", "env": "A:1;B:2"}
    )
    assert (r["count"], r["flag"], r["ratio"], r["pats"], r["env"]) == (
        7,
        True,
        1.0,
        ["A*", "B*"],
        {"A": "1", "B": "2"},
    )
    with pytest.raises(
        ValueError, match=r"cfg: unknown option\(s\) colour; valid options are: log_dir, count"
    ):
        opts.resolve({"part": "p", "colour": "red"})
    with pytest.raises(ValueError, match="cfg.count: expected int, got 'many'"):
        opts.resolve({"part": "p", "count": "many"})
    with pytest.raises(ValueError, match="cfg.count: expected int, got list"):
        opts.resolve({"part": "p", "count": [1]})
    with pytest.raises(ValueError, match="cfg.flag: expected a bool"):
        opts.resolve({"part": "p", "flag": "maybe"})
    with pytest.raises(ValueError, match="cfg.part: required option is missing"):
        opts.resolve({})
    with pytest.raises(ValueError, match="cfg.env: expected KEY:VALUE"):
        opts.resolve({"part": "p", "env": "novalue"})
    assert opts.cfg_from_str("part=p,env=A:1,B:2,count=3") == {
        "part": "p",
        "env": {"A": "1", "B": "2"},
        "count": 3,
    }
    text = str(opts)
    assert "required arguments:" in text and "optional arguments:" in text
    assert "log_dir=LOG_DIR (str, None)\n            where logs go" in text
    assert "count=COUNT (int, 2)" in text
    assert opts.get("count") is not None and opts.get("nope") is None
    assert "count" in opts and len(opts) == 7
    with pytest.raises(ValueError):
        opts.add("x", type_=str, help="h", default="d", required=True)


def test_app_handles() -> None:
    h = make_app_handle("local_cwd", "sess", "app-1")
    assert h == "local_cwd://sess/app-1"
    p = parse_app_handle(h)
    assert (p.scheduler_backend, p.session_name, p.app_id) == ("local_cwd", "sess", "app-1")
    assert parse_app_handle("slurm:///42").session_name == ""
    bad_handles = ["", "local_cwd", "local_cwd://sess", "local_cwd:/s/a", "x://s/a/b", "://s/a",
                   "slurm://s/123\n", " slurm://s/123", "slurm://s/123 "]  # fmt: skip
    for bad in bad_handles:
        with pytest.raises(MalformedAppHandleException, match="app handle: expected"):
            parse_app_handle(bad)
    # a named cluster's job: the app id carries the cluster
    assert parse_app_handle("slurm://s/hpc1:123").app_id == "hpc1:123"
    assert issubclass(MalformedAppHandleException, ValueError)


def test_dryrun_info_prints_request() -> None:
    info = AppDryRunInfo({"a": 1}, lambda r: f"REQ {r['a']}")
    assert str(info) == "REQ 1" and repr(info) == "REQ 1"
    assert info.request == {"a": 1}


def test_app_status_summaries() -> None:
    st = AppStatus(
        AppState.FAILED,
        roles=[
            RoleStatus(
                "w",
                [
                    ReplicaStatus(0, AppState.SUCCEEDED, "w", "h", exit_code=0),
                    ReplicaStatus(1, AppState.FAILED, "w", "h", exit_code=3),
                ],
            )
        ],
    )
    assert st.is_terminal()
    assert st.exit_codes() == {"w": [0, 3]}
    assert "w/1 FAILED exit_code=3" in st.format()
    assert st.to_json()["roles"][0]["replicas"][1]["state"] == "FAILED"
    assert RetryPolicy("REPLICA") is RetryPolicy.REPLICA
