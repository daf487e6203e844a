"""A replica that measures itself, for the usage tests of the Docker and Slurm backends."""

# runs ~6 s (sacct's Elapsed has whole seconds), holds ~200 MiB, burns 3 s of CPU first (a
# Docker sample taken during the rest sees all of it), writes what it measured as its result
MEASURE = r"""
import json, os, resource, time
t0, c0 = time.time(), time.process_time()
b = bytearray(200 * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1
while time.process_time() - c0 < 3.0:
    pass
while time.time() - t0 < 6.0:
    time.sleep(0.05)
ru = resource.getrusage(resource.RUSAGE_SELF)
json.dump({"cpu": ru.ru_utime + ru.ru_stime, "maxrss": ru.ru_maxrss * 1024,
           "wall": time.time() - t0}, open(os.environ["SHIPYARD_RESULT_FILE"], "w"))
"""
