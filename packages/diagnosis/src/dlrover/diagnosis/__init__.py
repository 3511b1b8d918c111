"""dlrover.diagnosis.

Failure evidence, classifier, hang and straggler detectors, node health probes and the action
policy.
"""

__all__: list[str] = []
