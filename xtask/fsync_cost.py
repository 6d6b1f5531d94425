#!/usr/bin/env python3
"""What one durable spool round costs by itself on a disk (docs/performance.md):
the floor under `sync` evidence that no code change above the kernel removes.

usage: python3 xtask/fsync_cost.py [DIR=$TMPDIR] [ROUNDS=2000] [BYTES=1024]

In a file in DIR zero-filled ahead (as the spool writer's segments are), ROUNDS
times: one `pwrite` of BYTES over the zeros, then one `fdatasync` — a spool round.
Then the same rounds appending to a file that grows (what zero-filling avoids).
Reports per round: wall time p50 / p99, the kernel CPU (stime) and user CPU of
this process, and its voluntary context switches.
"""
import os, resource, sys, tempfile, time

try:
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 1024
    if rounds < 1 or size < 1 or not os.path.isdir(directory):
        raise ValueError
except ValueError:
    sys.exit(__doc__)
buf = b"x" * size


def measure(name, fd, offset_of):
    walls = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(rounds):
        t = time.perf_counter()
        os.pwrite(fd, buf, offset_of(i))
        os.fdatasync(fd)
        walls.append(time.perf_counter() - t)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    walls.sort()
    us = lambda s: 1e6 * s / rounds
    print(f"{name}: wall p50 {1e6 * walls[rounds // 2]:.0f} / p99 {1e6 * walls[rounds * 99 // 100]:.0f} us; "
          f"kernel CPU {us(r1.ru_stime - r0.ru_stime):.1f} us, user {us(r1.ru_utime - r0.ru_utime):.1f} us, "
          f"{(r1.ru_nvcsw - r0.ru_nvcsw) / rounds:.2f} switches per round")


with tempfile.TemporaryDirectory(dir=directory) as d:
    path = os.path.join(d, "zeroed")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, bytes(rounds * size))
    os.fsync(fd)
    measure("overwrite of zeros + fdatasync (a spool round)", fd, lambda i: i * size)
    os.close(fd)
    fd = os.open(os.path.join(d, "growing"), os.O_RDWR | os.O_CREAT, 0o600)
    measure("append + fdatasync (the file grows)", fd, lambda i: i * size)
    os.close(fd)
