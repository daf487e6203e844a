"""A replica that measures itself, for the usage tests of the local, Docker and Slurm backends."""


def measure(mib: int, cpu: float, wall: float = 0.0) -> str:
    """The Python source of a replica that touches ``mib`` MiB, burns ``cpu`` seconds of CPU,
    runs until ``wall`` seconds have passed, and writes what it measured of itself (CPU
    seconds, peak RSS in bytes, wall seconds) to ``$SHIPYARD_RESULT_FILE``."""
    return rf"""
import json, os, resource, time
t0, c0 = time.monotonic(), time.process_time()
b = bytearray({mib} * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1
while time.process_time() - c0 < {cpu}:
    pass
while time.monotonic() - t0 < {wall}:
    time.sleep(0.05)
ru = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["SHIPYARD_RESULT_FILE"], "w") as f:
    json.dump({{"cpu": ru.ru_utime + ru.ru_stime, "maxrss": ru.ru_maxrss * 1024,
               "wall": time.monotonic() - t0}}, f)
"""


# runs ~6 s (sacct's Elapsed has whole seconds), holds ~200 MiB, burns 3 s of CPU first (a
# Docker sample taken during the rest sees all of it)
MEASURE = measure(200, 3.0, 6.0)
