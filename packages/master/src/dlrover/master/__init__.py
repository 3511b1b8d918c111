"""dlrover.master.

The job master: composes the DLRover libraries, node lifecycle, scheduler backends, state journal,
metrics and the dlrover-master CLI.
"""

__all__: list[str] = []
