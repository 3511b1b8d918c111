"""The pure decisions behind the standby's environment guard (`dlrover.launcher.env_guard`)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlrover.launcher import (
    EnvGuard,
    EnvWriteAction,
    also_imports,
    decide_env_write,
    import_time_sensitive,
    reads_environment_at_import,
    side_effect_of,
)

TORCH = ("torch",)
CLIENT = "dlrover.flashckpt.client"
CHECKPOINTER = "dlrover.flashckpt.checkpointer"
DEFAULT = ("torch", CHECKPOINTER)  # dlrover-run's default --prewarm


@pytest.mark.parametrize(
    "name",
    ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_AFFINITY", "LD_PRELOAD", "PYTHONHASHSEED", "TORCH_LOGS", "FOO"],
)
def test_every_name_counts_unless_listed(name: str) -> None:
    assert import_time_sensitive(name, TORCH)


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "PYTORCH_CUDA_ALLOC_CONF",
        "NCCL_DEBUG",
        "TORCH_NCCL_BLOCKING_WAIT",
        "GLOO_SOCKET_IFNAME",
        "TOKENIZERS_PARALLELISM",
        "HF_HOME",
        "TRANSFORMERS_CACHE",
        "WANDB_MODE",
    ],
)
def test_names_torch_reads_lazily_are_harmless_only_when_torch_alone_was_prewarmed(name: str) -> None:
    assert not import_time_sensitive(name, TORCH)
    assert not import_time_sensitive(name, ("torch", "torch.nn"))
    # transformers reads HF_HOME while it imports: a list checked against torch says nothing about it.
    assert import_time_sensitive(name, ("torch", "transformers"))
    assert import_time_sensitive(name, ("torchvision",))  # a prefix of a name is not a part of torch


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "NCCL_DEBUG", "HF_HOME", "FOO"])
@pytest.mark.parametrize("module", [CLIENT, CHECKPOINTER])
def test_the_flash_checkpoint_client_and_checkpointer_read_no_name_at_import_but_import_torch(
    name: str, module: str
) -> None:
    assert not reads_environment_at_import(module)
    assert not reads_environment_at_import("dlrover.flashckpt")
    assert not import_time_sensitive(name, (module,))
    assert not import_time_sensitive(name, ("dlrover.flashckpt", module))
    assert also_imports(module) == ("torch",)
    assert also_imports("dlrover.flashckpt") == ()
    # Alongside torch, torch decides; other parts of dlrover.flashckpt were not checked.
    assert import_time_sensitive(name, DEFAULT) is import_time_sensitive(name, TORCH)
    assert reads_environment_at_import("dlrover.flashckpt.hf")
    assert import_time_sensitive(name, ("dlrover.flashckpt.hf",))


def test_prewarming_the_client_alone_prewarmed_torch_too() -> None:
    guard = EnvGuard((CLIENT,), {})
    assert guard.pending == {CLIENT, "torch"}
    assert not guard.settled
    assert guard.on_env_write("OMP_NUM_THREADS", "8").action is EnvWriteAction.REEXEC


def test_a_program_that_imports_the_client_first_has_imported_torch_with_it() -> None:
    # In a fresh run `from dlrover.flashckpt.client import ...` imports torch; in a standby the
    # client is already loaded, so its `import torch` never runs where the guard could see it.
    guard = EnvGuard(("torch", CLIENT), {})
    guard.on_import(CLIENT)
    assert guard.pending == frozenset()
    assert guard.settled
    assert guard.on_env_write("OMP_NUM_THREADS", "8").action is EnvWriteAction.IGNORE
    # Under the default prewarm the checkpointer module stays pending, and it reads nothing.
    guard = EnvGuard(DEFAULT, {})
    guard.on_import(CLIENT)
    assert guard.pending == {CHECKPOINTER}
    assert guard.settled
    assert guard.on_env_write("OMP_NUM_THREADS", "8").action is EnvWriteAction.IGNORE


def test_a_program_that_imports_the_checkpointer_has_imported_torch_with_it() -> None:
    # `from dlrover.flashckpt import FlashCheckpointer` loads the checkpointer module lazily.
    guard = EnvGuard(DEFAULT, {})
    guard.on_import(CHECKPOINTER)
    assert guard.pending == frozenset()
    assert guard.on_env_write("OMP_NUM_THREADS", "8").action is EnvWriteAction.IGNORE


def test_a_write_matters_only_for_the_prewarmed_modules_the_program_has_yet_to_import() -> None:
    def decide(name: str, pending: set[str]) -> EnvWriteAction:
        return decide_env_write(name, "3", "1", prewarmed=DEFAULT, pending=pending, side_effect=None).action

    assert decide("OMP_NUM_THREADS", {"torch", CHECKPOINTER}) is EnvWriteAction.REEXEC
    # The program imported torch itself and never imports the checkpointer: a fresh run's torch
    # would not see the write either, and the checkpointer reads nothing.
    assert decide("OMP_NUM_THREADS", {CHECKPOINTER}) is EnvWriteAction.IGNORE
    assert decide("NCCL_DEBUG", {"torch", "transformers"}) is EnvWriteAction.REEXEC
    assert decide("NCCL_DEBUG", {"torch"}) is EnvWriteAction.IGNORE  # transformers is imported


def test_the_guard_settles_once_only_modules_that_read_nothing_are_pending() -> None:
    guard = EnvGuard(DEFAULT, {})
    assert not guard.settled
    guard.on_import("torch")
    assert guard.pending == {CHECKPOINTER}
    assert guard.settled
    assert guard.on_env_write("OMP_NUM_THREADS", "4").action is EnvWriteAction.IGNORE


@pytest.mark.parametrize(
    "name", ["RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "DLROVER_X"]
)
def test_the_worker_contract_is_harmless_for_any_module(name: str) -> None:
    assert not import_time_sensitive(name, TORCH)
    assert not import_time_sensitive(name, ("numpy",))


def _decide(
    name: str,
    value: str | None = "3",
    import_value: str | None = "1",
    *,
    pending: frozenset[str] = frozenset({"torch"}),
    side_effect: str | None = None,
) -> EnvWriteAction:
    return decide_env_write(name, value, import_value, prewarmed=TORCH, pending=pending, side_effect=side_effect).action


def test_a_sensitive_write_before_the_programs_import_reexecs() -> None:
    assert _decide("OMP_NUM_THREADS") is EnvWriteAction.REEXEC
    assert _decide("OMP_NUM_THREADS", value=None) is EnvWriteAction.REEXEC  # removed
    assert _decide("OMP_NUM_THREADS", import_value=None) is EnvWriteAction.REEXEC  # new


def test_writes_after_the_programs_import_are_ignored() -> None:
    assert _decide("OMP_NUM_THREADS", pending=frozenset()) is EnvWriteAction.IGNORE
    assert _decide("OMP_NUM_THREADS", pending=frozenset(), side_effect="forked") is EnvWriteAction.IGNORE


def test_allowlisted_names_and_unchanged_values_are_ignored() -> None:
    assert _decide("CUDA_VISIBLE_DEVICES") is EnvWriteAction.IGNORE
    assert _decide("OMP_NUM_THREADS", value="1", import_value="1") is EnvWriteAction.IGNORE
    assert _decide("OMP_NUM_THREADS", value=None, import_value=None) is EnvWriteAction.IGNORE


def test_after_a_side_effect_a_sensitive_write_warns_naming_the_variable_and_the_way_out() -> None:
    decision = decide_env_write(
        "OMP_NUM_THREADS", "3", "1", prewarmed=TORCH, pending={"torch"}, side_effect="opened a socket"
    )
    assert decision.action is EnvWriteAction.WARN
    assert "OMP_NUM_THREADS" in decision.reason
    assert "imported torch before OMP_NUM_THREADS was set" in decision.reason
    assert "opened a socket" in decision.reason
    assert "--prewarm none" in decision.reason
    # ... but not for a name torch reads lazily.
    assert _decide("NCCL_DEBUG", side_effect="opened a socket") is EnvWriteAction.IGNORE


def test_side_effects_are_what_a_second_run_would_repeat() -> None:
    wr = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
    assert side_effect_of("open", ("/tmp/log", "a", wr)) == "opened '/tmp/log' for writing"
    assert side_effect_of("open", ("/tmp/x", None, os.O_RDWR)) is not None  # os.open
    assert side_effect_of("open", ("/tmp/x", "r", os.O_RDONLY | os.O_CLOEXEC)) is None
    assert side_effect_of("open", ("/tmp/x", "rb", os.O_RDONLY)) is None
    # Importing writes bytecode; a second run rewrites it harmlessly.
    assert side_effect_of("open", ("/w/__pycache__/m.cpython-311.pyc.1234", None, wr)) is None
    assert side_effect_of("os.mkdir", ("/w/__pycache__", 0o777, -1)) is None
    assert side_effect_of("os.rename", ("/w/__pycache__/m.pyc.1", "/w/__pycache__/m.pyc", -1, -1)) is None
    assert side_effect_of("os.mkdir", ("/w/out", 0o777, -1)) is not None
    # ... or, with PYTHONPYCACHEPREFIX, under the prefix: the folders mirroring the sources and the files.
    prefix = "/cache/pyc"
    assert side_effect_of("os.mkdir", ("/cache/pyc/w/pkg", 0o777, -1), prefix) is None
    assert side_effect_of("open", ("/cache/pyc/w/pkg/m.cpython-311.pyc.77", None, wr), prefix) is None
    assert side_effect_of("os.rename", ("/cache/pyc/w/m.pyc.7", "/cache/pyc/w/m.pyc", -1, -1), prefix) is None
    assert side_effect_of("os.mkdir", ("/cache/pyc/w/pkg", 0o777, -1)) is not None  # no prefix set
    assert side_effect_of("open", ("/cache/pycs/log", "w", wr), prefix) is not None  # beside it, not under it
    assert side_effect_of("open", ("cache/pyc/log", "w", wr), prefix) is not None  # relative: not the prefix
    assert side_effect_of("os.remove", (b"/w/out", -1)) is not None
    for event in ("socket.__new__", "subprocess.Popen", "os.fork", "os.posix_spawn", "os.system", "os.kill"):
        assert side_effect_of(event, ()) is not None, event
    assert side_effect_of("mmap.__new__", (-1, 4096, 0, 0)) is None  # anonymous memory
    assert side_effect_of("mmap.__new__", (5, 4096, 0, 0)) == "mapped a file for writing"
    assert side_effect_of("mmap.__new__", (5, 4096, 1, 0)) is None  # ACCESS_READ
    for harmless in ("import", "compile", "exec", "os.listdir", "sys._getframe", "os.putenv"):
        assert side_effect_of(harmless, ("x",)) is None


def test_the_guard_follows_the_programs_imports_and_side_effects() -> None:
    guard = EnvGuard(("torch", "numpy.linalg"), {"OMP_NUM_THREADS": "1"})
    guard.on_import("numpy")  # numpy alone may not have imported numpy.linalg
    assert guard.pending == {"torch", "numpy.linalg"}
    guard.on_import("torch.nn")  # `import torch.nn` imports torch first
    assert guard.pending == {"numpy.linalg"}
    guard.on_side_effect("opened a socket")
    guard.on_side_effect("forked")
    assert guard.side_effect == "opened a socket"  # the first one is the one that matters
    assert guard.on_env_write("OMP_NUM_THREADS", "4").action is EnvWriteAction.WARN
    assert guard.on_env_write("OMP_NUM_THREADS", "5").action is EnvWriteAction.IGNORE  # said once
    guard.on_import("numpy.linalg.linalg")
    assert guard.settled
    assert guard.on_env_write("MKL_NUM_THREADS", "4").action is EnvWriteAction.IGNORE


def test_the_guard_stops_deciding_once_it_decided_to_reexec() -> None:
    guard = EnvGuard(TORCH, {})
    first = guard.on_env_write("OMP_NUM_THREADS", "4")
    assert first.action is EnvWriteAction.REEXEC
    assert guard.reexec == first
    assert guard.settled
    assert guard.on_env_write("MKL_NUM_THREADS", "4").action is EnvWriteAction.IGNORE


NAMES = ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "NCCL_DEBUG", "RANK", "CUDA_VISIBLE_DEVICES"]
MODULES = ["torch", "torch.nn", "numpy", "json", "torch.distributed.elastic", "dlrover.flashckpt", CLIENT, CHECKPOINTER]


def _model_reads(name: str, module: str) -> bool:
    """The model of which names a module may read at import, written out independently."""
    if name == "RANK" or module in ("dlrover.flashckpt", CLIENT, CHECKPOINTER):
        return False
    if module == "torch" or module.startswith("torch."):
        return name not in ("NCCL_DEBUG", "CUDA_VISIBLE_DEVICES")
    return True


class GuardMachine(RuleBasedStateMachine):
    """`EnvGuard` against a model that replays the whole history at every write."""

    modules = Bundle("modules")

    @initialize(
        prewarmed=st.sampled_from([("torch",), ("torch", "numpy"), ("json",), DEFAULT, (CLIENT, "numpy")]),
        import_env=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(["1", "2"])),
    )
    def start(self, prewarmed: tuple[str, ...], import_env: dict[str, str]) -> None:
        self.guard = EnvGuard(prewarmed, import_env)
        self.prewarmed = prewarmed
        self.import_env = import_env
        self.imports: list[str] = []
        self.side_effects: list[str] = []
        self.warned: set[str] = set()
        self.reexeced = False

    @rule(target=modules, name=st.sampled_from(MODULES))
    def a_module(self, name: str) -> str:
        return name

    @rule(name=modules)
    def program_imports(self, name: str) -> None:
        self.guard.on_import(name)
        self.imports.append(name)

    @rule(what=st.sampled_from(["opened a socket", "forked"]))
    def side_effect(self, what: str) -> None:
        self.guard.on_side_effect(what)
        self.side_effects.append(what)

    @precondition(lambda self: not self.reexeced)
    @rule(name=st.sampled_from(NAMES), value=st.sampled_from(["1", "2", None]))
    def program_writes(self, name: str, value: str | None) -> None:
        decision = self.guard.on_env_write(name, value)
        prewarmed = [*self.prewarmed, *(["torch"] if CLIENT in self.prewarmed else [])]
        imports = [*self.imports, *(["torch"] if CLIENT in self.imports else [])]
        pending = [m for m in prewarmed if not any(i == m or i.startswith(m + ".") for i in imports)]
        matters = any(_model_reads(name, m) for m in pending)
        if not matters or value == self.import_env.get(name):
            expected = EnvWriteAction.IGNORE
        elif self.side_effects:
            expected = EnvWriteAction.IGNORE if name in self.warned else EnvWriteAction.WARN
            self.warned.add(name)
        else:
            expected = EnvWriteAction.REEXEC
            self.reexeced = True
        assert decision.action is expected, (decision, self.imports, self.side_effects)
        assert decision.name == name
        assert name in decision.reason

    @invariant()
    def first_side_effect_kept(self) -> None:
        if hasattr(self, "guard"):
            assert self.guard.side_effect == (self.side_effects[0] if self.side_effects else None)


GuardMachine.TestCase.settings = settings(GuardMachine.TestCase.settings, stateful_step_count=30)
TestGuardMachine = GuardMachine.TestCase
