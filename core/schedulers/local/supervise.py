"""What an app's state is (:func:`observe`, which only reads) and the one place that acts on it
(:func:`settle`): gang termination when a replica failed, SIGKILL once a cancel's or a gang's
grace period is over, and the final state once every replica ended. The scheduler's describe,
its cancel and the log collector all go through here.

Standard library only: the log collector process imports this module too.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core.schedulers.local.appdir import AppDir
from core.schedulers.local.processes import Identity, terminate
from core.schedulers.local.records import LOST, SCRIPT_TIMEOUT, AppRecord, ExitCode, FinalState

__all__ = ["Observation", "final_state", "next_due", "observe", "settle"]


@dataclass
class Observation:
    """A look at an app: each replica's exit code (None while it runs) and the markers."""

    codes: list[ExitCode] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    cancelled: bool = False
    gang: bool = False
    timeout: bool = False
    done: FinalState | None = None
    names: set[str] = field(default_factory=set)

    @property
    def failed(self) -> list[int]:
        return [g for g, c in enumerate(self.codes) if c is not None and c != 0]


def identities(record: AppRecord) -> dict[int, Identity]:
    """Every replica's wrapper, by replica index."""
    return {r.index: Identity(r.pid, r.start_ticks) for r in record.replicas}


def observe(
    app: AppDir, record: AppRecord, alive: Callable[[list[int]], list[bool]] | None = None
) -> Observation | None:
    """Looks at the app's directory and processes (reads only); None if the app is gone.

    A recorded exit code always wins: a replica with one has ended, whatever runs under its
    pid now. ``alive(indices)`` tells which wrappers still run (default: /proc, exactly).
    """
    names = app.names()
    if names is None:
        return None
    obs = Observation()
    if AppDir.DONE in names:
        obs.done = app.read_final()
        if obs.done is not None:
            obs.names = names
            return obs
    recorded = app.exits()
    if recorded:
        # a cancel's or a gang's marker is made before the signals that ended these replicas,
        # so it may be newer than the first listing
        names = app.names() or names
    _markers(obs, names)
    unknown = [g for g in range(len(record.replicas)) if g not in recorded]
    if alive is None:
        idents = identities(record)
        states = [idents[g].alive() for g in unknown]
    else:
        states = alive(unknown)
    running = {g for g, up in zip(unknown, states, strict=True) if up}
    if len(running) < len(unknown):
        # ended since the first look: its exit code, and a cancel's or a gang's marker (made
        # before their signals), may be newer than what was read
        recorded = app.exits()
        _markers(obs, app.names() or names)
    for g in range(len(record.replicas)):
        if g in running and g not in recorded:
            obs.running.append(g)
            obs.codes.append(None)
        else:
            obs.codes.append(recorded.get(g, LOST))
    return obs


def _markers(obs: Observation, names: set[str]) -> None:
    obs.names = names
    obs.cancelled = AppDir.CANCELLED in names
    obs.gang = AppDir.GANG in names
    obs.timeout = AppDir.TIMEOUT in names


def settle(app: AppDir, record: AppRecord, obs: Observation, grace: float) -> FinalState | None:
    """Acts on ``obs``, and returns the final state once every replica ended (the first
    observer to record one in the app's directory decides it for all).

    * gang semantics: once a replica failed (and the app was not cancelled), the other replicas
      are sent SIGTERM (the ``gang`` marker names the first failure; only one observer acts);
    * after ``grace`` seconds of a cancel or a gang termination, survivors get SIGKILL.
    """
    if obs.done is not None:
        return obs.done
    if obs.running:
        _enforce(app, record, obs, grace)
        return None
    return app.write_final(final_state(app, record, obs))


def _enforce(app: AppDir, record: AppRecord, obs: Observation, grace: float) -> None:
    if _limit(app, record, obs):
        return
    if not obs.cancelled and not obs.gang and obs.failed:
        g = obs.failed[0]
        rep = record.replicas[g]
        info = {"replica": g, "role": rep.role, "k": rep.replica_id, "time": time.time(),
                "terminated": obs.running}  # fmt: skip
        if app.mark(AppDir.GANG, json.dumps(info)):
            _signal(record, obs.running, signal.SIGTERM)
        return
    for marker in _ending(obs):
        if app.age(marker) > grace:
            idents = identities(record)
            running = {g: idents[g] for g in obs.running}
            killed = terminate(record.app_id, running, grace=0.0, scan=False)
            for g, sig in killed.items():
                app.record_exit(g, -sig)
            return


def _ending(obs: Observation) -> list[str]:
    """The markers of what is ending the app (a cancel, a gang, the time limit): after their
    grace period, survivors get SIGKILL."""
    ends = (AppDir.CANCELLED, obs.cancelled), (AppDir.GANG, obs.gang), (AppDir.TIMEOUT, obs.timeout)
    return [marker for marker, active in ends if active]


def next_due(app: AppDir, record: AppRecord, obs: Observation, grace: float) -> float:
    """Seconds until :func:`settle` has something to do that no replica's end announces: a
    cancel's, a gang's or a time limit's grace running out, the checkpoint signal or the time
    limit (``inf``: nothing is due)."""
    due = float("inf")
    for marker in _ending(obs):
        due = min(due, grace - app.age(marker))
    limit = record.time_limit
    if limit is not None and record.requeues is None and not obs.cancelled and not obs.timeout:
        left = limit - (time.time() - record.submit_time)
        if record.checkpoint_signal is not None and AppDir.CHECKPOINT not in obs.names:
            due = min(due, left - record.checkpoint_grace)
        due = min(due, left)
    return max(due, 0.0)


def _signal(record: AppRecord, replicas: list[int], sig: signal.Signals) -> None:
    idents = identities(record)
    for g in replicas:
        idents[g].signal_group(sig)


def _limit(app: AppDir, record: AppRecord, obs: Observation) -> bool:
    """The time limit: the checkpoint signal ``checkpoint_grace`` seconds before it, then, at
    it, SIGTERM to every running replica (as a cancel; SIGKILL follows after the grace).
    The first observer to mark each step acts. True if the limit was reached just now."""
    limit = record.time_limit
    if limit is None or record.requeues is not None or obs.cancelled or obs.timeout:
        return False
    elapsed = time.time() - record.submit_time
    sig = record.checkpoint_signal
    if sig is not None and elapsed >= limit - record.checkpoint_grace:
        if app.mark(AppDir.CHECKPOINT, json.dumps({"signal": sig, "time": time.time()})):
            _signal(record, obs.running, signal.Signals[f"SIG{sig}"])
    if elapsed < limit:
        return False
    info = {"time_limit": limit, "time": time.time(), "terminated": obs.running}
    if app.mark(AppDir.TIMEOUT, json.dumps(info)):
        obs.timeout = True
        _signal(record, obs.running, signal.SIGTERM)
    return True


def _gang(app: AppDir, obs: Observation) -> tuple[int | None, set[int]]:
    """The replica whose failure terminated the others, and those terminated for it."""
    if not obs.gang:
        return None, set()
    try:
        info = json.loads(app.read(AppDir.GANG) or "")
        first, signalled = int(info["replica"]), {int(g) for g in info.get("terminated", [])}
    except (ValueError, KeyError, TypeError):
        return None, set()
    # those that ended by a signal (ours); one that exited with a code of its own failed itself
    return first, {g for g in signalled if g != first and _by_signal(obs.codes[g])}


def _by_signal(code: ExitCode) -> bool:
    return code == LOST or (isinstance(code, int) and code < 0)


def replica_states(app: AppDir, obs: Observation) -> list[str]:
    """Each replica's app state name."""
    _, terminated = _gang(app, obs)
    out = []
    for g, code in enumerate(obs.codes):
        if code is None:
            out.append("RUNNING")
        elif code == 0:
            out.append("SUCCEEDED")
        else:
            out.append("CANCELLED" if obs.cancelled or g in terminated else "FAILED")
    return out


def _timed_out(app: AppDir, record: AppRecord, obs: Observation) -> FinalState:
    states = ["SUCCEEDED" if c == 0 else "FAILED" for c in obs.codes]
    ended = sum(1 for c in obs.codes if c != 0)
    msg = f"time limit of {record.time_limit:g}s reached: {ended} replica(s) ended by it"
    return FinalState("FAILED", obs.codes, states, msg, time.time(), reason="timeout")


def describe_code(code: ExitCode) -> str:
    if code == LOST:
        return "ended without recording an exit code (its wrapper was killed)"
    if isinstance(code, int) and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def final_state(app: AppDir, record: AppRecord, obs: Observation) -> FinalState:
    """The final state of an app whose replicas all ended."""
    states = replica_states(app, obs)
    failed = obs.failed
    if obs.cancelled:
        return FinalState("CANCELLED", obs.codes, states, "cancelled", time.time())
    if obs.timeout or (record.requeues is not None and SCRIPT_TIMEOUT in obs.codes):
        return _timed_out(app, record, obs)
    if not failed:
        return FinalState("SUCCEEDED", obs.codes, states, "", time.time())
    first, terminated = _gang(app, obs)
    if first is None or first not in failed:
        first = failed[0]
    rep = record.replicas[first]
    msg = f"{rep.role}/{rep.replica_id} {describe_code(obs.codes[first])}"
    own = [g for g in failed if g != first and g not in terminated]
    if own:
        msg += f"; {len(own)} other replica(s) failed too"
    if terminated:
        msg += f"; the other replicas were terminated ({len(terminated)})"
    return FinalState("FAILED", obs.codes, states, msg, time.time())


def running_state(app: AppDir, obs: Observation) -> FinalState:
    """The state of an app some of whose replicas still run (not written anywhere)."""
    return FinalState("RUNNING", obs.codes, replica_states(app, obs))
