"""The ``shipyard`` command line.

::

    shipyard run app.yaml --scheduler local_cwd --wait --log
    shipyard run --replicas 2 -- echo hello          # an inline, single-role app
    shipyard status local_cwd://shipyard/hello-1a2b3c
    shipyard log local_cwd://shipyard/hello-1a2b3c/echo/0 --tail
    shipyard cancel local_cwd://shipyard/hello-1a2b3c
    shipyard list -s local_cwd
    shipyard list -s slurm --cfg cluster=hpc1
    shipyard runopts local_docker
    shipyard schema > shipyard-app.schema.json   # JSON Schema of app files, for editors

Exit codes: see :data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from core.durations import parse_duration, parse_time
from core.errors import ShipyardError
from core.specs import AppDef, AppState, Role, parse_app_handle

if TYPE_CHECKING:
    from core.cli_output import Output
    from core.reports import AppResult
    from core.runner import Runner
    from core.specs import AppStatus

log = logging.getLogger("core.cli")

EXIT_OK = 0
EXIT_APP_FAILED = 1
EXIT_USAGE = 2
#: the backend (Docker engine, Slurm controller, slurmrestd, SSH login node) could not be
#: reached or did not answer, after retries: nothing is known about the job, which may still
#: be running (sysexits' EX_TEMPFAIL: try again later)
EXIT_BACKEND_UNAVAILABLE = 75
EXIT_INTERRUPTED = 130

#: what each exit code of ``shipyard`` means (also shown by ``shipyard --help``)
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_APP_FAILED: "the app did not succeed, or is unknown",
    EXIT_USAGE: "bad input (arguments, app file, options)",
    EXIT_BACKEND_UNAVAILABLE: "the backend could not be reached or did not answer (after"
    " retries); the job's state is unknown: try again",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C; a job started by `run --wait` is cancelled)",
}


class _UsageError(ShipyardError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit code 2
        raise _UsageError(f"{self.prog}: {message}")


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env: expected KEY=VALUE, got {item!r}")
        env[key] = val
    return env


def _inline_app(args: argparse.Namespace) -> AppDef:
    cmd = list(args.command)
    if not cmd:
        raise ValueError("run: give an app file or a command after --")
    role = Role(
        name=args.role_name or _default_name(cmd[0]),
        image=args.image or "",
        entrypoint=cmd[0],
        args=cmd[1:],
        env=_parse_env(args.env or []),
        num_replicas=args.replicas,
    )
    return AppDef(name=args.name or role.name, roles=[role])


def _default_name(entrypoint: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", entrypoint.rsplit("/", 1)[-1]).strip("-.")
    return base[:40] or "app"


def _load_app(args: argparse.Namespace) -> AppDef:
    if args.appfile:
        from core.appfile import load_app  # imports yaml: only for app files

        if args.command:
            raise ValueError("run: give either an app file or a command after --, not both")
        app = load_app(args.appfile)
        if args.name:
            app.name = args.name
        return app
    return _inline_app(args)


def _result(runner: Runner, handle: str) -> AppResult | None:
    """What the app's replicas wrote to ``$SHIPYARD_RESULT_FILE``; None where the scheduler
    collects no results."""
    try:
        return runner.result(handle)
    except NotImplementedError:
        return None
    except ValueError:  # an array (its elements have results), or an element not started
        return None


def _cmd_check(
    runner: Runner, app: AppDef, scheduler: str, cfg: Any, args: argparse.Namespace
) -> int:
    """``run --check``: every problem a submit would hit, nothing started; exit 2 if any."""
    from core.cli_output import Output, problems_json

    problems = runner.preflight(app, scheduler, cfg, args.workspace)
    errors = sum(p.is_error for p in problems)
    out = Output(args.json)
    if args.json:
        out.object(problems_json(scheduler, problems))
        return EXIT_USAGE if errors else EXIT_OK
    for p in problems:
        out.text(f"{p.severity}: {p}".replace("\n", "; "))
    out.text(f"{scheduler}: {errors} problem(s) found" if errors else f"{scheduler}: no problems")
    return EXIT_USAGE if errors else EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    from core.cli_output import Output
    from core.runner import get_runner
    from core.watch.silence import effective_max_silence

    app = _load_app(args)
    # --max-silence, else the app's own (metadata.max_silence) once the run is waited for
    limit = effective_max_silence(_checked_max_silence(args), app)
    with get_runner() as runner:
        scheduler, cfg = _scheduler_and_cfg(runner, args)
        if args.check:
            return _cmd_check(runner, app, scheduler, cfg, args)
        out = Output(args.json)
        if args.dryrun:
            info = runner.dryrun(app, scheduler, cfg, args.workspace)
            if args.json:
                out.object({"scheduler": scheduler, "request": str(info)})
            else:
                out.text(f"=== scheduler request ({scheduler}) ===\n{info}")
            return EXIT_OK
        handle = _submit(runner, app, scheduler, cfg, args)
        waiting = bool(args.wait or args.log or args.max_silence is not None)
        out.submitted(handle, waiting)
        if not waiting:
            return EXIT_OK
        try:
            status = _wait(runner, handle, args, limit, out)
        except KeyboardInterrupt:  # (the watch cancelled the app)
            print(f"interrupted: cancelled {handle}", file=sys.stderr)
            out.ended_without_status(handle, "interrupted")
            return EXIT_INTERRUPTED
        if status is None:
            print(f"{handle}: unknown to the scheduler", file=sys.stderr)
            out.ended_without_status(handle, "unknown")
            return EXIT_APP_FAILED
        out.final(handle, status, _result(runner, handle))
        return EXIT_OK if status.state == AppState.SUCCEEDED else EXIT_APP_FAILED


def _scheduler_and_cfg(runner: Runner, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """``--scheduler`` and ``--cfg`` over the environment over the defaults files
    (:mod:`core.defaults`)."""
    from core.defaults import scheduler_and_cfg

    return scheduler_and_cfg(
        args.scheduler, args.cfg, runner.scheduler_backends(), runner.scheduler_run_opts
    )


def _submit(runner: Runner, app: AppDef, scheduler: str, cfg: Any, args: argparse.Namespace) -> str:
    """Submits the app, or the array ``--array``/``--array-params`` ask for."""
    if args.array is None and args.array_params is None:
        if args.max_parallel is not None:
            raise ValueError("--max-parallel: only for an array (--array or --array-params)")
        return runner.run(
            app, scheduler, cfg, args.workspace, args.idempotency_key, after=args.after,
            after_condition=args.after_condition,
        )  # fmt: skip
    if args.workspace:
        raise ValueError("--workspace: not supported with --array/--array-params yet")
    if args.array is not None and args.array_params is not None:
        raise ValueError("--array, --array-params: expected one of them, got both")
    size, cap = _array_range(args.array) if args.array is not None else (None, None)
    params = _read_params(args.array_params) if args.array_params is not None else None
    if cap is not None and args.max_parallel is not None:
        raise ValueError("--max-parallel: the cap is given twice (%K in --array)")
    cap = args.max_parallel if cap is None else cap
    return runner.run_array(
        app, scheduler, cfg, size=size, params=params, max_parallel=cap, after=args.after,
        after_condition=args.after_condition, idempotency_key=args.idempotency_key,
    )  # fmt: skip


def _array_range(text: str) -> tuple[int, int | None]:
    """``0-99%10`` -> (100, 10); ``100`` -> (100, None)."""
    m = re.fullmatch(r"(?:0-(?P<last>[0-9]+)|(?P<size>[0-9]+))(?:%(?P<cap>[0-9]+))?", text)
    if not m:
        raise ValueError(f"--array: expected 0-N[%K] or a size N[%K] (elements 0..N), got {text!r}")
    size = int(m.group("last")) + 1 if m.group("last") is not None else int(m.group("size"))
    return size, None if m.group("cap") is None else int(m.group("cap"))


def _read_params(path: str) -> list[Any]:
    """One JSON value per non-blank line of ``path`` (``-``: stdin)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise ValueError(f"--array-params: cannot read {path!r}: {e.strerror}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"--array-params: line {n} of {path} is not JSON ({e.msg})"
                ) from None
    return out


def _checked_max_silence(args: argparse.Namespace) -> float | None:
    from core.watch.silence import check_max_silence

    return check_max_silence(args.max_silence, "--max-silence")


def _wait(
    runner: Runner, handle: str, args: argparse.Namespace, limit: float | None, out: Output
) -> AppStatus | None:
    """Waits for the app: with ``--log`` printing every replica's lines, otherwise showing
    replica states on stderr as they change (``--progress``: auto, a live line on a terminal
    and plain lines otherwise; live; plain; none). With a ``max_silence`` (``--max-silence``
    or the app's own) a replica silent that long cancels the app (exit 1, naming it). Ctrl-C
    cancels the app."""
    from core.errors import JobSilentError
    from core.watch.job import JobWatch
    from core.watch.progress import Progress

    if args.log and is_array_handle(handle):
        return _wait_array_logs(runner, handle, out)
    progress = None
    if not args.log and args.progress != "none":
        live = None if args.progress == "auto" else args.progress == "live"
        progress = Progress(sys.stderr, live=live)
    watch = JobWatch(
        runner,
        handle,
        poll_interval=0.2,
        first_delay=0.001,
        shared=False,
        cancel_on_exit=True,
        logs=args.log or limit is not None,
        on_line=(
            (lambda line: out.log_line(handle, line.role, line.replica, line.line))
            if args.log
            else None
        ),
        max_silence=limit,
        on_status=progress.update if progress is not None else None,
    )
    try:
        return watch.run().status
    except JobSilentError as e:
        print(f"shipyard: {e}", file=sys.stderr)
        return runner.wait(handle, wait_interval=0.2)
    finally:
        if progress is not None:
            progress.close()


def is_array_handle(handle: str) -> bool:
    """Whether ``handle`` names a whole array (not one app, not one element)."""
    from core import arrays
    from core.specs import parse_app_handle

    app_id = parse_app_handle(handle).app_id
    return arrays.is_array_id(app_id) and arrays.split_element_id(app_id)[1] is None


def _wait_array_logs(runner: Runner, handle: str, out: Output) -> AppStatus | None:
    """``run --array --log``: every element's lines, each prefixed ``[i]``, printed as that
    element ends (elements run side by side: their lines would interleave). Ctrl-C cancels the
    array."""
    from core.specs import is_terminal
    from core.watch.job import JobWatch

    printed: set[int] = set()

    def print_ended(status: AppStatus) -> None:
        for e in status.elements or []:
            if e.index in printed or not is_terminal(e.state) or e.handle is None:
                continue
            printed.add(e.index)
            try:
                for role, k in runner.replicas(e.handle):
                    for line in runner.log_lines(e.handle, role, k):
                        out.log_line(e.handle, role, k, line, element=e.index)
            except ValueError as err:  # (e.g. an element cancelled before it ran)
                print(f"[{e.index}] no logs: {err}", file=sys.stderr)

    watch = JobWatch(
        runner, handle, poll_interval=0.2, first_delay=0.001, shared=False,
        cancel_on_exit=True, on_status=print_ended,
    )  # fmt: skip
    return watch.run().status


def _cmd_status(args: argparse.Namespace) -> int:
    from core.runner import get_runner

    parse_app_handle(args.handle)
    with get_runner() as runner:
        status = runner.status(args.handle)
        result = _result(runner, args.handle) if status is not None else None
    if status is None:
        print(f"{args.handle}: no such app", file=sys.stderr)
        return EXIT_APP_FAILED
    if args.json:
        out = {"app_handle": args.handle, **status.to_json()}
        out["result"] = result.to_json()["replicas"] if result is not None else None
        print(json.dumps(out, indent=2))
    else:
        from core.cli_output import Output

        Output().final(args.handle, status, result)
    return EXIT_OK


def _split_log_target(target: str) -> tuple[str, str | None, int | None]:
    m = re.fullmatch(
        r"(?P<handle>[^:/]+://[^/]*/[^/]+)(?:/(?P<role>[^/]+)(?:/(?P<k>[^/]+))?)?/?", target
    )
    if not m:
        parse_app_handle(target)  # raises the standard malformed-handle error
        raise ValueError(f"log: expected HANDLE[/role[/replica]], got {target!r}")
    k = m.group("k")
    if k is not None and not k.isdigit():
        raise ValueError(f"log: replica: expected a non-negative integer, got {k!r}")
    return m.group("handle"), m.group("role"), None if k is None else int(k)


def _cmd_log(args: argparse.Namespace) -> int:
    from core.cli_output import Output
    from core.runner import get_runner
    from core.schedulers.api import Stream

    handle, role, k = _split_log_target(args.target)
    if args.regex is not None:
        try:
            re.compile(args.regex)
        except (re.error, OverflowError, RecursionError) as e:
            raise ValueError(f"--regex: not a regular expression ({e}): {args.regex!r}") from None
    since = parse_time(args.since, "--since") if args.since else None
    until = parse_time(args.until, "--until") if args.until else None
    streams = Stream(args.streams) if args.streams else None
    out = Output(args.json, flush=args.tail)  # (a whole log: flushed once per replica)
    with get_runner() as runner:
        replicas = runner.replicas(handle)
        if not replicas:
            print(f"{handle}: no such app", file=sys.stderr)
            return EXIT_APP_FAILED
        selected = [
            (r, i) for r, i in replicas if (role is None or r == role) and (k is None or i == k)
        ]
        if not selected:
            raise ValueError(f"log: {handle} has no replica {role}/{'*' if k is None else k}")
        if args.tail and len(selected) > 1:  # several replicas: followed together
            for entry in runner.stream_logs(
                handle, should_tail=True, regex=args.regex, streams=streams, since=since
            ):
                if (entry.role, entry.replica) in selected:
                    out.log_line(handle, entry.role, entry.replica, entry.line)
                    out.stream.flush()
            return EXIT_OK
        prefix = len(selected) > 1
        for r, i in selected:
            lines = runner.log_lines(
                handle, r, i, regex=args.regex, since=since, until=until,
                should_tail=args.tail, streams=streams,
            )  # fmt: skip
            for line in lines:
                out.log_line(handle, r, i, line, prefix=prefix)
            out.stream.flush()
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace) -> int:
    from core.runner import get_runner

    parse_app_handle(args.handle)
    timeout = parse_duration(args.timeout, "--timeout")
    with get_runner() as runner:
        if runner.status(args.handle) is None:
            print(f"{args.handle}: no such app", file=sys.stderr)
            return EXIT_APP_FAILED
        runner.cancel(args.handle)
        status = runner.wait(args.handle, wait_interval=0.2, timeout=timeout) if args.wait else None
    state = status.state.name if status is not None else None
    if args.json:
        print(json.dumps({"app_handle": args.handle, "cancelled": True, "state": state}))
    else:
        print(f"{args.handle} {state}" if state else f"cancelled {args.handle}")
    return EXIT_OK


def _cmd_list(args: argparse.Namespace) -> int:
    import inspect

    from core.runner import get_runner

    with get_runner() as runner:
        scheduler, cfg = _scheduler_and_cfg(runner, args)
        if (
            not args.cfg
            and "cfg" not in inspect.signature(runner.scheduler(scheduler).list).parameters
        ):
            cfg = {}  # (the defaults' run options are for a scheduler that lists by them)
        apps = runner.list(scheduler, cfg or None)
    if args.json:
        print(
            json.dumps(
                [
                    {"app_handle": a.app_handle, "app_id": a.app_id, "state": a.state.name}
                    for a in apps
                ]
            )
        )
        return EXIT_OK
    for a in apps:
        print(f"{a.app_handle}\t{a.state.name}")
    return EXIT_OK


def _cmd_runopts(args: argparse.Namespace) -> int:
    from core.runner import get_runner

    with get_runner() as runner:
        if args.scheduler:
            if args.scheduler not in runner.scheduler_backends():
                raise ValueError(
                    f"scheduler: unknown scheduler {args.scheduler!r}; expected one of"
                    f" {', '.join(runner.scheduler_backends())}"
                )
            opts = {args.scheduler: runner.scheduler_run_opts(args.scheduler)}
        else:
            opts = runner.run_opts()
    if args.json:
        from core.cli_output import runopts_json

        print(json.dumps(runopts_json(opts), indent=2))
        return EXIT_OK
    for name, o in opts.items():
        print(f"{name}:\n{o}")
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from core.appfile import app_json_schema

    print(json.dumps(app_json_schema(), indent=2))
    return EXIT_OK


class _VersionAction(argparse.Action):
    """``--version``: :data:`core.__version__`, the one version source (the package metadata's
    version is read from it at build time)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from core import __version__

        print(f"shipyard {__version__}")
        parser.exit()


def _epilog() -> str:
    codes = "\n".join(f"  {code:<4}{meaning}" for code, meaning in EXIT_CODES.items())
    return (
        f"exit codes:\n{codes}\n\n"
        "shell completion (bash, zsh; argcomplete):\n"
        '  eval "$(register-python-argcomplete shipyard)"'
    )


def _add_run_parser(sub: Any) -> None:
    """``shipyard run``'s arguments."""
    from core import cli_complete as complete

    run = sub.add_parser("run", help="submit an app (from a YAML file or an inline command)")
    complete.attach(
        run.add_argument(
            "-s", "--scheduler", help="scheduler to run on (default: the defaults', or local_cwd)"
        ),
        complete.schedulers,
    )
    complete.attach(
        run.add_argument(
            "--cfg", help="scheduler options: k1=v1,k2=v2 (see `shipyard runopts`), over defaults"
        ),
        complete.cfg_keys,
    )
    run.add_argument("--workspace", help="directory to apply as the workspace")
    run.add_argument("--dryrun", action="store_true", help="print the request, submit nothing")
    run.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the handle; with --wait the final status too; with --log each line"
        " (JSON lines); with --check the problems; with --dryrun the request",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="pre-flight: list every problem a submit would hit (each naming its field),"
        " start nothing; exit 2 if there is one",
    )
    run.add_argument(
        "--wait",
        action="store_true",
        help="wait for the app to finish, showing replica states on stderr as they change",
    )
    run.add_argument(
        "--progress",
        choices=["auto", "live", "plain", "none"],
        default="auto",
        help="with --wait: a live status line (live), a line per change (plain), nothing"
        " (none); auto: live on a terminal, plain otherwise",
    )
    run.add_argument(
        "--log",
        action="store_true",
        help="stream the logs of every replica (implies --wait); of an array, each element's"
        " lines prefixed [i], as the element ends",
    )
    run.add_argument(
        "--max-silence",
        metavar="DURATION",
        help="cancel the app once a running replica printed no line for that long (a hung"
        " collective); implies --wait. Default: the app's metadata.max_silence when waiting",
    )
    run.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="submit once per KEY: a rerun (after exit 75, a crash, a timeout) gets the app"
        " the first one made, if it made one",
    )
    _add_array_and_after_args(run)
    run.add_argument("--name", help="app name (default: from the file or the command)")
    run.add_argument("--role-name", help="inline app: role name")
    run.add_argument("--image", help="inline app: image")
    run.add_argument("--replicas", type=int, default=1, help="inline app: number of replicas")
    run.add_argument("--env", action="append", help="inline app: KEY=VALUE (repeatable)")
    run.add_argument("appfile", nargs="?", help="APP.yaml (or give an inline command after --)")
    run.set_defaults(func=_cmd_run)


def _add_array_and_after_args(run: argparse.ArgumentParser) -> None:
    """``shipyard run``'s arguments for arrays (``--array`` ...) and dependencies (``--after``)."""
    from core import cli_complete as complete

    run.add_argument(
        "--array",
        metavar="0-N[%K]",
        help="run the app as an array of elements 0..N (each sees $SHIPYARD_ARRAY_INDEX and"
        " ${array_index}), at most K at once",
    )
    run.add_argument(
        "--array-params",
        metavar="FILE.jsonl",
        help="run the app as an array, one element per JSON object of the file (its keys as"
        " ${params.NAME}, the object in $SHIPYARD_ARRAY_PARAMS)",
    )
    run.add_argument(
        "--max-parallel", type=int, metavar="K", help="an array's elements running at once"
    )
    complete.attach(
        run.add_argument(
            "--after",
            action="append",
            metavar="HANDLE",
            help="start only once this app (or array) ended (repeatable; see --after-condition)",
        ),
        complete.handles,
    )
    run.add_argument(
        "--after-condition",
        choices=["ok", "any", "notok"],
        default="ok",
        help="with --after: they all succeeded (ok, the default), all ended (any), all ended"
        " without success (notok); else the app ends CANCELLED",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``shipyard`` argument parser."""
    from core import cli_complete as complete

    p = _Parser(
        prog="shipyard",
        description="Launch and follow multi-role jobs.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_VersionAction)
    p.add_argument("-v", "--verbose", action="store_true", help="log what shipyard does")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    _add_run_parser(sub)

    st = sub.add_parser("status", help="show an app's state and replicas")
    complete.attach(st.add_argument("handle"), complete.handles)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    lg = sub.add_parser("log", help="print an app's logs: HANDLE[/role[/replica]]")
    complete.attach(lg.add_argument("target"), complete.log_targets)
    lg.add_argument("--regex", help="only lines matching this regular expression")
    lg.add_argument("--since", help="ISO time or duration ago (30s, 5m, 2h, 1h30m)")
    lg.add_argument("--until", help="ISO time or duration ago")
    lg.add_argument("-t", "--tail", action="store_true", help="follow until the app ends")
    lg.add_argument("--streams", choices=["stdout", "stderr", "combined"])
    lg.add_argument(
        "--json", action="store_true", help="JSON lines: app_handle, role, replica, line"
    )
    lg.set_defaults(func=_cmd_log)

    cc = sub.add_parser("cancel", help="cancel an app")
    complete.attach(cc.add_argument("handle"), complete.handles)
    cc.add_argument("--wait", action="store_true", help="wait until it is terminal")
    cc.add_argument("--json", action="store_true", help="print app_handle, cancelled, state")
    cc.add_argument(
        "--timeout", default="60", metavar="DURATION", help="with --wait: at most this long (60)"
    )
    cc.set_defaults(func=_cmd_cancel)

    ls = sub.add_parser("list", help="list apps on a scheduler")
    complete.attach(
        ls.add_argument("-s", "--scheduler", help="default: the defaults', or local_cwd"),
        complete.schedulers,
    )
    complete.attach(
        ls.add_argument("--cfg", help="scheduler options, e.g. cluster=hpc1 for -s slurm"),
        complete.cfg_keys,
    )
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_cmd_list)

    ro = sub.add_parser("runopts", help="show the options of one or every scheduler")
    complete.attach(ro.add_argument("scheduler", nargs="?"), complete.schedulers)
    ro.add_argument("--json", action="store_true", help="name, type, default, help, required")
    ro.set_defaults(func=_cmd_runopts)

    sc = sub.add_parser(
        "schema",
        help="print the JSON Schema of app files (for editors, e.g. the YAML language server)",
    )
    sc.set_defaults(func=_cmd_schema)
    return p


def _complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion: when the shell asks (argcomplete sets ``_ARGCOMPLETE``), answers and
    exits; otherwise does nothing (and imports nothing)."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:  # completion is optional: without argcomplete, nothing to offer
        return
    argcomplete.autocomplete(parser)


def _error_lines(e: BaseException) -> list[str]:
    """``e`` as ``shipyard: error: ...`` lines: one, or one per issue of an app file."""
    appfile = sys.modules.get("core.appfile")  # (an AppFileError means it was imported)
    if appfile is not None and isinstance(e, appfile.AppFileError):
        return [f"shipyard: error: {line}" for line in str(e).splitlines()]
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return [f"shipyard: error: {first}"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``shipyard`` command line ``argv`` (default: ``sys.argv[1:]``); returns the exit
    code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after the first `--` is the inline command of `run`
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    try:
        parser = build_parser()
        _complete(parser)
        args = parser.parse_args(argv)
        if command and args.cmd != "run":
            raise _UsageError(f"shipyard {args.cmd}: unexpected arguments after --")
        args.command = command
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        return int(args.func(args))
    except _UsageError as e:
        print(str(e).splitlines()[0], file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, TimeoutError) as e:
        print("\n".join(_error_lines(e)), file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError) else EXIT_APP_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # anything else: still one line, no traceback unless -v
        if "-v" in argv or "--verbose" in argv:
            raise
        return _unexpected(e)


def _unexpected(e: Exception) -> int:
    """The exit code of an error no command handled, printed on one line: the backend could
    not be reached (:data:`EXIT_BACKEND_UNAVAILABLE`), or anything else (exit 1)."""
    from core.transient import BackendUnavailableError, is_transient

    first = str(e).splitlines()[0] if str(e) else ""
    if isinstance(e, BackendUnavailableError) or is_transient(e):
        print(
            f"shipyard: error: backend unavailable (try again later): {first or type(e).__name__}",
            file=sys.stderr,
        )
        return EXIT_BACKEND_UNAVAILABLE
    print(f"shipyard: error: {type(e).__name__}: {first}", file=sys.stderr)
    return EXIT_APP_FAILED


def console_main() -> None:
    """The ``shipyard`` console script: :func:`main`, then exit with its code."""
    code = main()
    _skip_final_collection()
    sys.exit(code)


def _skip_final_collection() -> None:
    """``gc.freeze()`` just before the process exits: the interpreter's teardown then spares
    itself a scan of every object by the cycle collector.

    Kept for the bench row ``startup: `shipyard run --wait -- true` wall`` (target <= 150 ms):
    the scan takes 20-25 ms of the command since the scheduler entry points are read with
    ``importlib.metadata`` (whose objects stay alive). Measured pairwise, the row took 125-170
    ms without it against 107-148 ms with it, so it missed its target on a loaded host.
    """
    gc.freeze()


if __name__ == "__main__":
    console_main()
