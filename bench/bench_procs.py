"""This process's children, for the loader scripts of `bench/run latency`
and `bench/run stall`: their pids, their CPU time, and ending a run with
every one of them killed (so that no request of this run overlaps the
next one)."""

import json
import os
import signal
import sys


def _proc_stats():
    """(pid, fields after the command name) of every process in /proc."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        yield int(name), stat[stat.rfind(")") + 2:].split()


def child_pids():
    """The pids of this process's children."""
    me = os.getpid()
    return [pid for pid, fields in _proc_stats() if int(fields[1]) == me]


def children_cpu_seconds():
    """CPU seconds (user + system) of this process and its child processes."""
    me = os.getpid()
    total = 0
    for pid, fields in _proc_stats():
        if pid == me or int(fields[1]) == me:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def finish(prog, code, message=None, result=None):
    """Kills the children, prints `prog: message` on stderr and `result` as
    one JSON line on stdout (each when given), and exits with `code` at once."""
    for pid in child_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if message:
        print(f"{prog}: {message}", file=sys.stderr, flush=True)
    if result is not None:
        print(json.dumps(result), flush=True)
    os._exit(code)
