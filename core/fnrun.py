"""The runtime of a Python function run as a job (:meth:`core.runner.Runner.run_function`).

The job runs this module's source as ``python -c``, so the job's interpreter needs only
``cloudpickle`` and the function's own imports, not Shipyard. It reads the function and its
arguments from the environment variable SHIPYARD_FUNCTION (base64 of zlib of cloudpickle; in an array, one element's
arguments from SHIPYARD_ARRAY_PARAMS), calls it, and writes the outcome as JSON to
SHIPYARD_RESULT_FILE: the return value pickled, or the exception (pickled where it can be)
with its formatted traceback. It exits 0 on a return, 1 on an exception, 3 when it cannot start
(interpreter mismatch, cloudpickle missing, an argument that does not load here).

This module imports only the standard library (cloudpickle once running) and must not contain a
dollar sign: its text passes through the app's macro substitution.
"""

import base64
import json
import os
import pickle
import sys
import traceback
import zlib

#: the marker key of a function job's result document
MARKER = "shipyard_function"
#: largest pickled return value sent back (the result file's limit is 1 MiB, base64 adds a third)
MAX_VALUE_BYTES = 700 * 1024


def _dump(obj):
    try:
        import cloudpickle

        return cloudpickle.dumps(obj)
    except ImportError:
        return pickle.dumps(obj)


def _write(doc):
    doc[MARKER] = 1
    path = os.environ.get("SHIPYARD_RESULT_FILE")
    if not path:
        sys.stderr.write("shipyard: no SHIPYARD_RESULT_FILE to write the outcome to\n")
        return
    with open(path, "w") as f:
        json.dump(doc, f)


def _fail_to_start(kind, message):
    sys.stderr.write(f"shipyard: {message}\n")
    _write({"ok": False, "kind": kind, "message": message})
    sys.exit(3)


def _load():
    want = os.environ.get("SHIPYARD_FUNCTION_PYTHON", "")
    have = "{}.{}".format(*sys.version_info[:2])
    if want and want != have:
        _fail_to_start(
            "interpreter",
            f"python: the function was pickled by Python {want} but this job's interpreter"
            f" ({sys.executable}) is Python {have}; cloudpickle needs the same minor version",
        )
    try:
        import cloudpickle  # noqa: F401 - the payload's functions load through it
    except ImportError:
        _fail_to_start(
            "interpreter",
            f"python: this job's interpreter ({sys.executable}, Python {have}) cannot import"
            " cloudpickle; install it there",
        )
    try:
        fn, args, kwargs = pickle.loads(zlib.decompress(base64.b64decode(_env("FUNCTION"))))
        params = os.environ.get("SHIPYARD_ARRAY_PARAMS")
        if params and MARKER in json.loads(params):
            blob = json.loads(params)[MARKER]
            args, kwargs = pickle.loads(zlib.decompress(base64.b64decode(blob)))
    except Exception as e:
        _fail_to_start(
            "load",
            f"function: could not load the function or its arguments in the job: "
            f"{type(e).__name__}: {e} (is every module it uses importable there?)",
        )
    _name_files(fn)
    return fn, args, kwargs


def _name_files(fn):
    """Gives the functions that came by value the file they were written in (cloudpickle
    drops it), so that the traceback names the file and line of each frame."""
    origin = os.environ.get("SHIPYARD_FUNCTION_FILE")
    if not origin:
        return
    for obj in [fn, *getattr(fn, "__globals__", {}).values()]:
        code = getattr(obj, "__code__", None)
        if code is not None and code.co_filename == "<dynamic-code>":
            try:
                obj.__code__ = code.replace(co_filename=origin)
            except (AttributeError, TypeError, ValueError):
                pass


def _env(name):
    return os.environ["SHIPYARD_" + name]


def _raised(e):
    text = "".join(traceback.format_exception(e))
    sys.stderr.write(text)
    try:
        blob = base64.b64encode(_dump(e)).decode("ascii")
    except Exception:  # an exception that does not pickle comes back by its type and text
        blob = None
    name = f"{type(e).__module__}.{type(e).__qualname__}"
    _write({"ok": False, "kind": "raised", "type": name, "message": str(e),
            "traceback": text, "exception": blob})  # fmt: skip
    sys.exit(1)


def _returned(value):
    try:
        data = _dump(value)
    except Exception as e:
        _write({"ok": False, "kind": "result",
                "message": f"result: the return value cannot be pickled: {type(e).__name__}: {e}"})  # fmt: skip
        sys.exit(1)
    if len(data) > MAX_VALUE_BYTES:
        _write({"ok": False, "kind": "result",
                "message": f"result: the return value pickles to {len(data)} bytes, more than"
                f" the {MAX_VALUE_BYTES} that come back with a job; write it to a file and"
                " return the file's path"})  # fmt: skip
        sys.exit(1)
    _write({"ok": True, "value": base64.b64encode(data).decode("ascii")})


def main():
    """Runs the function of the environment variable SHIPYARD_FUNCTION and writes its outcome."""
    fn, args, kwargs = _load()
    try:
        value = fn(*args, **kwargs)
    except Exception as e:
        _raised(e)
    _returned(value)


if __name__ == "__main__":
    main()
