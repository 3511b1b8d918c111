"""dlrover.diagnosis: know why a job failed, find hung, slow and faulty nodes, and pick the action.

* Evidence (`Evidence`, `read_log_tail`, `extract_tracebacks`, `one_line_summary`, `ExitInfo`, `StepReport`, ...):
  frozen values; the log reader never reads more than a configured tail.
* Classifier (`classify`, `RuleRegistry`, `Rule`): evidence to a `FailureKind` with a
  confidence, the deciding lines and a reason; third parties add rules through the
  ``dlrover.diagnosis.rules`` entry-point group. `signal_in_log` reads the signal a launcher or a
  shell wrote into a log (``exitcode: -11``, ``Killed``) the way an exit status is read.
* Action policy (`ActionPolicy`, `PolicyConfig`): kind to `ActionKind`, with budgets and escalation;
  a node's process restarts are one `RestartBudget`, spent by one rule (`spend_restart`); a
  `BudgetWindow` says how long a use counts against a budget.
* Step reports (`StepReporter`, from `dlrover.common.step_slots`): a training process marks step
  ends, samples and phases in its slot of a file its agent maps; `RankStepStats` batches them to
  the master. `report_gradient_sync` has a DDP model mark each step's first gradient
  synchronization, from which a slow rank of a synchronous job is found.
* Reported failures (`reported_kind`, `LOST_NODE_KIND`, `OOM_RECORD_KIND`, `SLOW_NODE_KIND`,
  `diagnose_report`, `kind_decided_alone`, `PEER_CONSEQUENCE_KINDS`, `KINDS_NOT_FROM_DATA`):
  the kind an agent or the master names for what it saw, and the kind decided on once the
  evidence is read; the master and the agent name no kind themselves.
* Detectors (`HangDetector`, `StragglerDetector`): pure, ``now`` passed in.
* The host's OOM records (`OomWatch`: the memory cgroup's ``oom_kill`` counter, the kernel log),
  read by the agent for a failed worker and added to its evidence.
* Node health (`run_paired_probe`) and stack dumps (`request_stack_dump`).
"""

from typing import TYPE_CHECKING

from dlrover.common.lazy import lazy_exports

if TYPE_CHECKING:
    from dlrover.common.step_slots import StepReporter
    from dlrover.diagnosis.budget import RelaunchBudget, RestartBudget, Spending, spend_restart
    from dlrover.diagnosis.classifier import CONSEQUENCE_KINDS, KIND_PRECEDENCE, Diagnosis, RuleMatch, classify
    from dlrover.diagnosis.ddp_sync import report_gradient_sync
    from dlrover.diagnosis.detectors import (
        HangConfig,
        HangDetector,
        StragglerConfig,
        StragglerDetector,
        StragglerReport,
    )
    from dlrover.diagnosis.errors import DiagnosisError, ProbeError, RulePluginError
    from dlrover.diagnosis.evidence import (
        DEFAULT_PHASE,
        AnchoredExcuse,
        Evidence,
        GpuSample,
        HangReport,
        LossSample,
        PeerExcuse,
        ProbeResult,
        RankStepStats,
        ResourceSample,
        StepReport,
    )
    from dlrover.diagnosis.exitinfo import ExitInfo
    from dlrover.diagnosis.kinds import NODE_CHECK_FAILED, TRANSIENT_KINDS, ActionKind, FailureKind
    from dlrover.diagnosis.logsignals import LogSignal, signal_in_log
    from dlrover.diagnosis.logtail import LogTail, TailConfig, read_log_tail, read_tail_from_stream, tail_from_bytes
    from dlrover.diagnosis.oomrecord import MEMORY_RECORD, NO_OOM_KILL, OomCount, OomWatch
    from dlrover.diagnosis.policy import (
        DEFAULT_LADDERS,
        ActionPolicy,
        Decision,
        LadderStep,
        PolicyConfig,
        PolicyStateError,
    )
    from dlrover.diagnosis.probe import ProbeConfig, pick_backend, run_paired_probe, run_probe
    from dlrover.diagnosis.registry import ENTRY_POINT_GROUP, RuleRegistry
    from dlrover.diagnosis.reported import (
        KINDS_NOT_FROM_DATA,
        LOST_NODE_KIND,
        OOM_RECORD_KIND,
        PEER_CONSEQUENCE_KINDS,
        SLOW_NODE_KIND,
        diagnose_report,
        kind_decided_alone,
        reported_kind,
    )
    from dlrover.diagnosis.resources import VISIBLE_DEVICES_ENV, sample_gpus, visible_gpus
    from dlrover.diagnosis.rules import (
        ExceptionRule,
        FunctionRule,
        LogPatternRule,
        Rule,
        builtin_rules,
        killed_words,
        validate_rule,
    )
    from dlrover.diagnosis.stackdump import (
        DEFAULT_DUMP_SIGNAL,
        StackDump,
        StackDumpHandler,
        install_stack_dump_handler,
        main_thread_frames,
        request_stack_dump,
    )
    from dlrover.diagnosis.tracebacks import PythonTraceback, extract_tracebacks, one_line_summary, strip_rank_prefix
    from dlrover.diagnosis.window import BudgetWindow

# Imported on first use: an agent starting a node needs a few names, not the classifier's rules.
_EXPORTS = {
    "ActionKind": "dlrover.diagnosis.kinds",
    "FailureKind": "dlrover.diagnosis.kinds",
    "TRANSIENT_KINDS": "dlrover.diagnosis.kinds",
    "LOST_NODE_KIND": "dlrover.diagnosis.reported",
    "OOM_RECORD_KIND": "dlrover.diagnosis.reported",
    "PEER_CONSEQUENCE_KINDS": "dlrover.diagnosis.reported",
    "KINDS_NOT_FROM_DATA": "dlrover.diagnosis.reported",
    "SLOW_NODE_KIND": "dlrover.diagnosis.reported",
    "diagnose_report": "dlrover.diagnosis.reported",
    "kind_decided_alone": "dlrover.diagnosis.reported",
    "reported_kind": "dlrover.diagnosis.reported",
    "DEFAULT_PHASE": "dlrover.diagnosis.evidence",
    "AnchoredExcuse": "dlrover.diagnosis.evidence",
    "Evidence": "dlrover.diagnosis.evidence",
    "ExitInfo": "dlrover.diagnosis.exitinfo",
    "GpuSample": "dlrover.diagnosis.evidence",
    "HangReport": "dlrover.diagnosis.evidence",
    "LogTail": "dlrover.diagnosis.logtail",
    "LossSample": "dlrover.diagnosis.evidence",
    "PeerExcuse": "dlrover.diagnosis.evidence",
    "ProbeResult": "dlrover.diagnosis.evidence",
    "PythonTraceback": "dlrover.diagnosis.tracebacks",
    "RankStepStats": "dlrover.diagnosis.evidence",
    "ResourceSample": "dlrover.diagnosis.evidence",
    "StepReport": "dlrover.diagnosis.evidence",
    "StepReporter": "dlrover.common.step_slots",
    "report_gradient_sync": "dlrover.diagnosis.ddp_sync",
    "TailConfig": "dlrover.diagnosis.logtail",
    "extract_tracebacks": "dlrover.diagnosis.tracebacks",
    "one_line_summary": "dlrover.diagnosis.tracebacks",
    "read_log_tail": "dlrover.diagnosis.logtail",
    "read_tail_from_stream": "dlrover.diagnosis.logtail",
    "strip_rank_prefix": "dlrover.diagnosis.tracebacks",
    "tail_from_bytes": "dlrover.diagnosis.logtail",
    "MEMORY_RECORD": "dlrover.diagnosis.oomrecord",
    "NO_OOM_KILL": "dlrover.diagnosis.oomrecord",
    "OomCount": "dlrover.diagnosis.oomrecord",
    "OomWatch": "dlrover.diagnosis.oomrecord",
    "LogSignal": "dlrover.diagnosis.logsignals",
    "signal_in_log": "dlrover.diagnosis.logsignals",
    "Diagnosis": "dlrover.diagnosis.classifier",
    "ENTRY_POINT_GROUP": "dlrover.diagnosis.registry",
    "ExceptionRule": "dlrover.diagnosis.rules",
    "FunctionRule": "dlrover.diagnosis.rules",
    "KIND_PRECEDENCE": "dlrover.diagnosis.classifier",
    "CONSEQUENCE_KINDS": "dlrover.diagnosis.classifier",
    "LogPatternRule": "dlrover.diagnosis.rules",
    "NODE_CHECK_FAILED": "dlrover.diagnosis.kinds",
    "Rule": "dlrover.diagnosis.rules",
    "RuleMatch": "dlrover.diagnosis.classifier",
    "RuleRegistry": "dlrover.diagnosis.registry",
    "builtin_rules": "dlrover.diagnosis.rules",
    "classify": "dlrover.diagnosis.classifier",
    "killed_words": "dlrover.diagnosis.rules",
    "validate_rule": "dlrover.diagnosis.rules",
    "ActionPolicy": "dlrover.diagnosis.policy",
    "DEFAULT_LADDERS": "dlrover.diagnosis.policy",
    "Decision": "dlrover.diagnosis.policy",
    "LadderStep": "dlrover.diagnosis.policy",
    "PolicyConfig": "dlrover.diagnosis.policy",
    "PolicyStateError": "dlrover.diagnosis.policy",
    "RelaunchBudget": "dlrover.diagnosis.budget",
    "RestartBudget": "dlrover.diagnosis.budget",
    "Spending": "dlrover.diagnosis.budget",
    "spend_restart": "dlrover.diagnosis.budget",
    "BudgetWindow": "dlrover.diagnosis.window",
    "HangConfig": "dlrover.diagnosis.detectors",
    "HangDetector": "dlrover.diagnosis.detectors",
    "StragglerConfig": "dlrover.diagnosis.detectors",
    "StragglerDetector": "dlrover.diagnosis.detectors",
    "StragglerReport": "dlrover.diagnosis.detectors",
    "DEFAULT_DUMP_SIGNAL": "dlrover.diagnosis.stackdump",
    "ProbeConfig": "dlrover.diagnosis.probe",
    "StackDump": "dlrover.diagnosis.stackdump",
    "StackDumpHandler": "dlrover.diagnosis.stackdump",
    "install_stack_dump_handler": "dlrover.diagnosis.stackdump",
    "main_thread_frames": "dlrover.diagnosis.stackdump",
    "pick_backend": "dlrover.diagnosis.probe",
    "request_stack_dump": "dlrover.diagnosis.stackdump",
    "run_paired_probe": "dlrover.diagnosis.probe",
    "run_probe": "dlrover.diagnosis.probe",
    "sample_gpus": "dlrover.diagnosis.resources",
    "visible_gpus": "dlrover.diagnosis.resources",
    "VISIBLE_DEVICES_ENV": "dlrover.diagnosis.resources",
    "DiagnosisError": "dlrover.diagnosis.errors",
    "ProbeError": "dlrover.diagnosis.errors",
    "RulePluginError": "dlrover.diagnosis.errors",
}

__all__ = [
    # kinds
    "ActionKind",
    "FailureKind",
    "TRANSIENT_KINDS",
    # the kind of a reported failure
    "LOST_NODE_KIND",
    "OOM_RECORD_KIND",
    "PEER_CONSEQUENCE_KINDS",
    "KINDS_NOT_FROM_DATA",
    "SLOW_NODE_KIND",
    "diagnose_report",
    "kind_decided_alone",
    "reported_kind",
    # evidence
    "DEFAULT_PHASE",
    "AnchoredExcuse",
    "Evidence",
    "ExitInfo",
    "GpuSample",
    "HangReport",
    "LogTail",
    "LossSample",
    "PeerExcuse",
    "ProbeResult",
    "PythonTraceback",
    "RankStepStats",
    "ResourceSample",
    "StepReport",
    "StepReporter",
    "report_gradient_sync",
    "TailConfig",
    "extract_tracebacks",
    "one_line_summary",
    "read_log_tail",
    "read_tail_from_stream",
    "strip_rank_prefix",
    "tail_from_bytes",
    "MEMORY_RECORD",
    "NO_OOM_KILL",
    "OomCount",
    "OomWatch",
    # classifier
    "LogSignal",
    "signal_in_log",
    "Diagnosis",
    "ENTRY_POINT_GROUP",
    "ExceptionRule",
    "FunctionRule",
    "KIND_PRECEDENCE",
    "CONSEQUENCE_KINDS",
    "LogPatternRule",
    "NODE_CHECK_FAILED",
    "Rule",
    "RuleMatch",
    "RuleRegistry",
    "builtin_rules",
    "classify",
    "killed_words",
    "validate_rule",
    # policy
    "ActionPolicy",
    "BudgetWindow",
    "DEFAULT_LADDERS",
    "Decision",
    "LadderStep",
    "PolicyConfig",
    "PolicyStateError",
    "RelaunchBudget",
    "RestartBudget",
    "Spending",
    "spend_restart",
    # detectors
    "HangConfig",
    "HangDetector",
    "StragglerConfig",
    "StragglerDetector",
    "StragglerReport",
    # resources, probes, stack dumps
    "DEFAULT_DUMP_SIGNAL",
    "ProbeConfig",
    "StackDump",
    "StackDumpHandler",
    "install_stack_dump_handler",
    "main_thread_frames",
    "pick_backend",
    "request_stack_dump",
    "run_paired_probe",
    "run_probe",
    "sample_gpus",
    "visible_gpus",
    "VISIBLE_DEVICES_ENV",
    # errors
    "DiagnosisError",
    "ProbeError",
    "RulePluginError",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
