"""dlrover.launcher.

The per-node elastic agent and the torchrun-compatible dlrover-run command.
"""

__all__: list[str] = []
