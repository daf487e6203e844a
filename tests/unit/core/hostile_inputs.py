"""Hostile inputs shared by the hostile-input and fault tests: a fixed corpus plus hypothesis
strategies, and the settings that keep the property tests bounded in CI.

The shell-injection payloads all try to create the file ``{canary}`` (formatted by the test with a
path in its temp dir), so "nothing executed" is checked by that file not existing.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.services import in_ci

#: bounded, reproducible property tests: derandomized (same examples every run) in CI, random
#: exploration on a developer's machine; no example database written into the tree.
HOSTILE_SETTINGS = settings(
    max_examples=int(os.environ.get("SHIPYARD_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    database=None,
    derandomize=in_ci(),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: strings that try to run ``touch {canary}`` if they ever reach a shell unquoted
INJECTION_TEMPLATES: list[str] = [
    "$(touch {canary})",
    "`touch {canary}`",
    "; touch {canary}",
    "| touch {canary}",
    "&& touch {canary}",
    "|| touch {canary}",
    "x\ntouch {canary}",
    "x\rtouch {canary}",
    "' ; touch {canary} ; '",
    '" ; touch {canary} ; "',
    "'\"$(touch {canary})\"'",
    "\\'; touch {canary}; echo \\'",
    "$'\\x27'; touch {canary}",
    "${{IFS}}touch${{IFS}}{canary}",
    "$(IFS=_;cmd=touch_{canary};$cmd)",
    "> {canary}",
    ">{canary}",
    "<(touch {canary})",
    "&touch {canary}&",
    "x\n#SBATCH --wrap='touch {canary}'\n",
    "x\n\ntouch {canary}\n#",
    "\ntouch {canary}\n",
    "eval 'touch {canary}'",
    "-o ProxyCommand=touch {canary}",
    "$({{touch,{canary}}})",
]

#: values that are not shell syntax but are awkward elsewhere (files, terminals, encodings)
AWKWARD_STRINGS: list[str] = [
    "",
    " ",
    "-",
    "--",
    "-h",
    "--help",
    "*",
    "?",
    "~",
    "$HOME",
    "${HOME}",
    "%j %x %u %N %%",
    "${replica_id}",
    "${app_id}",
    "${unknown_macro",
    "$",
    "\\",
    "\t",
    "\x1b[31mred\x1b[0m",
    "\x7f",
    "\x01\x02\x03",
    "héllo wörld",
    "日本語",
    "emoji 🚀",
    "\u202eevil",
    "zero\u200bwidth",
    "\ufeffbom",
    "a" * 10_000,
    "line1\nline2",
    "=",
    "a=b=c",
    ",",
    "a,b",
    ":",
    "null",
    "true",
    "0",
    "-1",
]

#: path traversal and absolute paths for names, directories and mounts
TRAVERSAL_STRINGS: list[str] = [
    "..",
    ".",
    "../",
    "../..",
    "../../../../../../etc/passwd",
    "/etc/passwd",
    "/",
    "a/../../b",
    "a/b",
    "..\\..\\windows",
    "%2e%2e%2f",
    "./.",
    "~root",
    "/dev/null",
    "/proc/self/environ",
]


def injection_strings(canary: str) -> list[str]:
    """The injection corpus, each payload aimed at creating ``canary``."""
    return [t.format(canary=canary) for t in INJECTION_TEMPLATES]


def corpus(canary: str = "/tmp/shipyard-canary-never") -> list[str]:
    """Every fixed hostile string."""
    return injection_strings(canary) + AWKWARD_STRINGS + TRAVERSAL_STRINGS


_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
#: valid app/role names (what core.specs accepts); built directly: st.from_regex is slow
safe_names = st.tuples(st.sampled_from(_ALNUM), st.text(alphabet=_ALNUM + "_.-", max_size=62)).map(
    "".join
)
#: valid environment variable names
env_names = st.tuples(
    st.sampled_from(_ALNUM[:52] + "_"), st.text(alphabet=_ALNUM + "_", max_size=12)
).map("".join)
#: any text including control characters and lone surrogates
any_text = st.text(st.characters(exclude_categories=()), max_size=80)
#: text biased toward the fixed corpus
hostile_text = st.one_of(st.sampled_from(corpus()), any_text)
#: values of any JSON/YAML-ish type
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)
plain_data = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(hostile_text, st.integers()), children, max_size=4),
    ),
    max_leaves=20,
)
