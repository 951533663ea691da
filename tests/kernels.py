"""Jupyter kernels of the tests talk to their clients over Unix sockets in a folder of their own, not over TCP
ports of the machine.

A kernel client's ZeroMQ sockets call on the kernel's ports again every 0.1 s for as long as they are open, and
nbclient shuts a kernel down before it closes its client: for a while the freed ports are still called on. Once
(a fresh-clone CI) one of them had just become the port a Spark driver in another test opened to hand a collect's
rows to Python; Spark's server read ZeroMQ's greeting (0xFF, then zeros) as the length of the secret it expects,
died without failing the collect, and the collect waited for ever. A listener on ever-new ports beside the suite
caught such calls: 161 in three seconds to one port, all from a test worker, all ZeroMQ's greeting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets.config import Config


def ipc(folder: Path) -> dict[str, Any]:
    """A KernelManager's settings for a kernel whose channels are the Unix sockets `folder/kernel-N` (an absolute
    path: the kernel runs in a folder of its own)."""
    return {"transport": "ipc", "ip": str(folder.resolve() / "kernel")}


def ipc_config(folder: Path) -> Config:
    """NotebookClient's `config=` for a kernel of those settings."""
    return Config({"KernelManager": ipc(folder)})
