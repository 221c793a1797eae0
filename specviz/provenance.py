"""Where a measurement was made: the code's commit, the command, the machine, its load and the
software, as one JSON-ready dict. ``specviz bench`` records it in ``bench.json`` (``meta``),
``specviz eval`` in ``eval.json`` and ``specviz align`` beside its CSV files, so a result can be
read without knowing the day it was made. Nothing here touches the network; torch is only
looked at, never imported.
"""
from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path

#: the checkout this package runs from (its commit is the one recorded)
ROOT = Path(__file__).resolve().parents[1]


def provenance() -> dict:
    """commit, command, cpu_model, cpu_count, torch_threads, load_avg, python, torch, created.

    Call it when a run starts: ``load_avg`` is the machine's 1/5/15-minute load then.
    ``torch_threads`` is None when torch is not imported yet."""
    torch = sys.modules.get("torch")
    return {"commit": git_commit(), "command": command(), "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "load_avg": load_avg(), "python": platform.python_version(),
            "torch": getattr(torch, "__version__", None) or _installed("torch"),
            "created": datetime.now().astimezone().isoformat(timespec="seconds")}


def git_commit(root: str | Path = ROOT) -> str:
    """``git rev-parse HEAD`` of the checkout at ``root``, with ``-dirty`` appended when a tracked
    file differs from it (untracked files do not count, as with ``git describe --dirty``);
    "unknown" when ``root`` is not the top of a git checkout or git is missing."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != Path(root).resolve():
            return "unknown"    # e.g. installed into a virtualenv that sits inside a checkout
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def command(argv: list[str] | None = None) -> str:
    """The command line (``sys.argv`` by default), shell-quoted; ``python -m specviz`` stands
    for the path of the package's ``__main__.py``."""
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith("__main__.py") and \
            Path(argv[0]).resolve() == Path(__file__).with_name("__main__.py"):
        argv[:1] = ["python", "-m", "specviz"]
    return shlex.join(argv)


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The first "model name" of ``cpuinfo`` (Linux), else ``platform.processor()``, else
    "unknown"."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_avg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, or None where the system has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
