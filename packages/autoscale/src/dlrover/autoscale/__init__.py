"""dlrover.autoscale.

Throughput models, an OR-tools resource planner, runtime heuristics and a job profile store.
"""

__all__: list[str] = []
