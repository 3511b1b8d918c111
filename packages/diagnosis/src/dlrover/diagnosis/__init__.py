"""dlrover.diagnosis: know why a job failed, find hung, slow and faulty nodes, and pick the action.

* Evidence (`Evidence`, `read_log_tail`, `extract_tracebacks`, `one_line_summary`, `ExitInfo`, `StepReport`, ...):
  frozen values; the log reader never reads more than a configured tail.
* Classifier (`classify`, `RuleRegistry`, `Rule`): evidence to a `FailureKind` with a
  confidence, the deciding lines and a reason; third parties add rules through the
  ``dlrover.diagnosis.rules`` entry-point group. `signal_in_log` reads the signal a launcher or a
  shell wrote into a log (``exitcode: -11``, ``Killed``) the way an exit status is read.
* Action policy (`ActionPolicy`, `PolicyConfig`): kind to `ActionKind`, with budgets and escalation;
  a node's process restarts are one `RestartBudget`, spent by one rule (`spend_restart`).
* Step reports (`StepReporter`, from `dlrover.common.step_slots`): a training process marks step
  ends, samples and phases in its slot of a file its agent maps; `RankStepStats` batches them to
  the master.
* Reported failures (`reported_kind`, `LOST_NODE_KIND`, `OOM_RECORD_KIND`, `SLOW_NODE_KIND`, `diagnose_report`,
  `kind_decided_alone`):
  the kind an agent or the master names for what it saw, and the kind decided on once the
  evidence is read; the master and the agent name no kind themselves.
* Detectors (`HangDetector`, `StragglerDetector`): pure, ``now`` passed in.
* The host's OOM records (`OomWatch`: the memory cgroup's ``oom_kill`` counter, the kernel log),
  read by the agent for a failed worker and added to its evidence.
* Node health (`run_paired_probe`) and stack dumps (`request_stack_dump`).
"""

from dlrover.common.step_slots import StepReporter
from dlrover.diagnosis.budget import RelaunchBudget, RestartBudget, Spending, spend_restart
from dlrover.diagnosis.classifier import CONSEQUENCE_KINDS, KIND_PRECEDENCE, Diagnosis, RuleMatch, classify
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
    Evidence,
    GpuSample,
    HangReport,
    LossSample,
    ProbeResult,
    RankStepStats,
    ResourceSample,
    StepReport,
)
from dlrover.diagnosis.exitinfo import ExitInfo
from dlrover.diagnosis.kinds import TRANSIENT_KINDS, ActionKind, FailureKind
from dlrover.diagnosis.logsignals import LogSignal, signal_in_log
from dlrover.diagnosis.logtail import LogTail, TailConfig, read_log_tail, read_tail_from_stream, tail_from_bytes
from dlrover.diagnosis.oomrecord import MEMORY_RECORD, OomCount, OomWatch
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
    LOST_NODE_KIND,
    OOM_RECORD_KIND,
    SLOW_NODE_KIND,
    diagnose_report,
    kind_decided_alone,
    reported_kind,
)
from dlrover.diagnosis.resources import sample_gpus
from dlrover.diagnosis.rules import (
    NODE_CHECK_FAILED,
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
    request_stack_dump,
)
from dlrover.diagnosis.tracebacks import PythonTraceback, extract_tracebacks, one_line_summary, strip_rank_prefix

__all__ = [
    # kinds
    "ActionKind",
    "FailureKind",
    "TRANSIENT_KINDS",
    # the kind of a reported failure
    "LOST_NODE_KIND",
    "OOM_RECORD_KIND",
    "SLOW_NODE_KIND",
    "diagnose_report",
    "kind_decided_alone",
    "reported_kind",
    # evidence
    "DEFAULT_PHASE",
    "Evidence",
    "ExitInfo",
    "GpuSample",
    "HangReport",
    "LogTail",
    "LossSample",
    "ProbeResult",
    "PythonTraceback",
    "RankStepStats",
    "ResourceSample",
    "StepReport",
    "StepReporter",
    "TailConfig",
    "extract_tracebacks",
    "one_line_summary",
    "read_log_tail",
    "read_tail_from_stream",
    "strip_rank_prefix",
    "tail_from_bytes",
    "MEMORY_RECORD",
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
    "pick_backend",
    "request_stack_dump",
    "run_paired_probe",
    "run_probe",
    "sample_gpus",
    # errors
    "DiagnosisError",
    "ProbeError",
    "RulePluginError",
]
