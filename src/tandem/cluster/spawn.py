"""Starting a replica's process: Popen in its own session, its output to a log file per replica."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from tandem.cluster.names import bounded_name

__all__ = ["OUTPUT_TAIL_BYTES", "LoggedProcess", "ProcessHandle", "Spawner", "log_file_name", "popen_spawner"]

OUTPUT_TAIL_BYTES = 4000  # how much of a dead replica's output is kept and logged


class ProcessHandle(Protocol):
    """The part of subprocess.Popen the backend uses, plus the end of the process's output."""

    pid: int

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def output_tail(self) -> str: ...


Spawner = Callable[[list[str], Mapping[str, str], str], ProcessHandle]  # argv, env, replica id -> process


class LoggedProcess:
    """A Popen whose stdout and stderr go to `log_path` (or nowhere), with the end of that file at hand."""

    def __init__(self, process: subprocess.Popen, log_path: Path | None) -> None:
        self.process = process
        self.log_path = log_path
        self.pid = process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def output_tail(self) -> str:
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - OUTPUT_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""


LOG_NAME_CHARS = 100  # a replica's log file name, less ".log"; file systems allow 255 bytes


def log_file_name(replica_id: str) -> str:
    """`<replica id>.log`; a longer id (a variant named at length) is cut to its start and a short hash
    of it (tandem.cluster.names): a file name must fit in 255 bytes, or no replica ever starts."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", replica_id).lstrip(".") or "replica"
    return bounded_name(safe, LOG_NAME_CHARS, source=replica_id) + ".log"


def popen_spawner(log_dir: str | Path | None = None) -> Spawner:
    """Start replicas with subprocess.Popen in their own session (the gateway, not the terminal's
    Ctrl-C, decides when they stop); output goes to LOG_DIR/<replica id>.log (`log_file_name`), or
    is discarded."""

    def spawn(argv: list[str], env: Mapping[str, str], replica_id: str) -> ProcessHandle:
        path = None
        if log_dir is None:
            out = subprocess.DEVNULL
        else:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            path = Path(log_dir) / log_file_name(replica_id)
            out = open(path, "ab")  # noqa: SIM115 (the child gets its own descriptor; ours closes below)
        try:
            process = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        return LoggedProcess(process, path)

    return spawn
