"""The evidence model: bounded log tails, traceback extraction, exit status decoding, validation."""

from __future__ import annotations

import io
import math
import tracemalloc
from pathlib import Path

import pytest

from dlrover.common import ConfigError
from dlrover.diagnosis import (
    Evidence,
    ExitInfo,
    LossSample,
    StepReport,
    TailConfig,
    extract_tracebacks,
    read_log_tail,
    read_tail_from_stream,
    strip_rank_prefix,
    tail_from_bytes,
)


class CountingReader(io.RawIOBase):
    """A seekable binary stream over a real file that counts the bytes handed out by read()."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self.bytes_read += len(data)
        return data

    def close(self) -> None:
        self._f.close()
        super().close()


def test_exit_info_decodes_both_conventions() -> None:
    assert ExitInfo(-9).signal == 9
    assert ExitInfo(-9).signal_name == "SIGKILL"
    assert ExitInfo(137).signal == 9
    assert ExitInfo(143).signal_name == "SIGTERM"
    assert ExitInfo(1).signal is None
    assert ExitInfo(0).succeeded
    assert ExitInfo(137).describe() == "exit status 137 (SIGKILL)"
    assert ExitInfo(2).describe() == "exit status 2"


def test_tail_reads_only_the_end_and_drops_the_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    tail = read_log_tail(path, TailConfig(max_bytes=1000))
    assert tail.bytes_read == 1000
    assert tail.truncated
    assert tail.lines[-1] == "line 9999"
    assert all(line.startswith("line ") and len(line.split()) == 2 for line in tail.lines)
    first = int(tail.lines[0].split()[1])
    assert first > 9800  # only the end was read, and the partial first line was dropped


def test_tail_of_small_file_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    path.write_text("a\nb\n\n")
    tail = read_log_tail(path)
    assert tail.lines == ("a", "b")
    assert not tail.truncated
    assert tail.file_size == 5


def test_max_lines_keeps_the_last() -> None:
    tail = tail_from_bytes(b"\n".join(b"x%d" % i for i in range(100)), TailConfig(max_lines=3))
    assert tail.lines == ("x97", "x98", "x99")
    assert tail.truncated


def test_control_chars_colours_progress_bars_and_long_lines_are_cleaned() -> None:
    data = b"\x1b[31mred\x1b[0m\n 10%\r 50%\r100%\nnul\x00here\n" + b"y" * 50
    tail = tail_from_bytes(data, TailConfig(max_line_chars=10))
    assert tail.lines == ("red", "100%", "nul here", "y" * 10)


def test_binary_garbage_is_flagged_not_fatal() -> None:
    garbage = bytes(range(256)) * 50
    tail = tail_from_bytes(garbage, TailConfig())
    assert tail.binary_fraction > 0.3
    assert all("\x00" not in line for line in tail.lines)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_tail_config_rejects_bad_values(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_bytes"):
        TailConfig(max_bytes=bad)  # type: ignore[arg-type]


def test_reader_never_reads_more_than_the_tail_of_a_200_mb_log(tmp_path: Path) -> None:
    path = tmp_path / "huge.log"
    size = 200 * 1024 * 1024
    with path.open("wb") as f:
        f.write(b"step 1 loss 2.0\n" * 1000)
        f.seek(size - 200)  # sparse: the middle costs no disk
        f.write(b'\nTraceback (most recent call last):\n  File "t.py", line 1, in <module>\nTypeError: boom\n')
    cfg = TailConfig(max_bytes=64 * 1024)
    stream = CountingReader(path)
    try:
        tracemalloc.start()
        tail = read_tail_from_stream(stream, cfg, source=str(path))  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        stream.close()
    assert stream.bytes_read <= cfg.max_bytes
    assert tail.bytes_read <= cfg.max_bytes
    assert tail.file_size >= size - 200
    assert peak < 16 * cfg.max_bytes, peak  # bounded by the tail, not the 200 MB file
    assert tail.lines[-1] == "TypeError: boom"


def test_strip_rank_prefixes() -> None:
    assert strip_rank_prefix("[rank3]: TypeError: x") == "TypeError: x"
    assert strip_rank_prefix("[default0]:Traceback") == "Traceback"
    assert strip_rank_prefix("[1,0]<stderr>:ValueError") == "ValueError"
    assert strip_rank_prefix("plain") == "plain"


def test_extract_chained_and_prefixed_tracebacks() -> None:
    lines = [
        "noise",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "a.py", line 3, in <module>',
        "[rank1]:     import x",
        "[rank1]: ModuleNotFoundError: No module named 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 9, in f',
        "",
        "    g()",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ]
    tbs = extract_tracebacks(lines)
    assert [(t.exc_type, t.exc_name) for t in tbs] == [
        ("ModuleNotFoundError", "ModuleNotFoundError"),
        ("torch.OutOfMemoryError", "OutOfMemoryError"),
    ]
    assert tbs[0].frames == ('File "a.py", line 3, in <module>',)
    assert tbs[0].message == "No module named 'x'"
    assert tbs[1].line_index == 12


def test_bare_syntax_error_without_header_is_found() -> None:
    tbs = extract_tracebacks(['  File "t.py", line 2', "    x = (", "        ^", "SyntaxError: '(' was never closed"])
    assert [t.exc_type for t in tbs] == ["SyntaxError"]
    assert tbs[0].frames == ()


def test_ordinary_log_lines_are_not_exceptions() -> None:
    lines = ["INFO: started", "ERROR: disk", "/x/y.py:3: UserWarning: careful", "step 3 loss 1.0", "Warning: x"]
    assert extract_tracebacks(lines) == ()


def test_tracebacks_under_a_label_and_in_markdown_are_read() -> None:
    # torchrun's failure summary indents the traceback of the root cause under a label.
    summary = [
        "Root Cause (first observed failure):",
        "  traceback : Traceback (most recent call last):",
        '    File "train.py", line 20, in main',
        "      model.fit(loader)",
        "  TypeError: fit() missing 1 required positional argument: 'epochs'",
        "============================================================",
    ]
    (tb,) = extract_tracebacks(summary)
    assert (tb.exc_name, tb.frames, tb.line_index) == ("TypeError", ('File "train.py", line 20, in main',), 4)
    # srun --label puts the task number before every line.
    labelled = [
        "3: Traceback (most recent call last):",
        '3:   File "t.py", line 3, in f',
        "3:     x()",
        "3: KeyError: 'a'",
    ]
    assert [(t.exc_name, t.frames) for t in extract_tracebacks(labelled)] == [
        ("KeyError", ('File "t.py", line 3, in f',))
    ]
    # A pasted log keeps its Markdown: a quote marker, inline code, a fence glued to the text.
    pasted = ["> RuntimeError: boom", "`OSError: [Errno 28] No space left on device`", "```ValueError: bad"]
    assert [(t.exc_name, t.message) for t in extract_tracebacks(pasted)] == [
        ("RuntimeError", "boom"),
        ("OSError", "[Errno 28] No space left on device"),
        ("ValueError", "bad"),
    ]
    # ... or emphasis around the line; a name's own underscores stay.
    emphasised = [
        "_**RuntimeError: x (y)**_",
        "**_KeyError: 'a'_**",
        "*_pickle.UnpicklingError: w*",
        "**__main__.E1Error: z**",
    ]
    assert [(t.exc_type, t.message) for t in extract_tracebacks(emphasised)] == [
        ("RuntimeError", "x (y)"),
        ("KeyError", "'a'"),
        ("_pickle.UnpicklingError", "w"),
        ("__main__.E1Error", "z"),
    ]
    assert extract_tracebacks(["* note: the loss", "**Error**: see below"]) == ()


def test_evidence_from_text_computes_tracebacks() -> None:
    ev = Evidence.from_text("Traceback (most recent call last):\nKeyError: 'a'\n", returncode=1)
    assert ev.exit == ExitInfo(1)
    assert [t.exc_name for t in ev.tracebacks] == ["KeyError"]
    assert Evidence().lines() == ()


def test_value_validation_names_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="rank"):
        StepReport(rank=-1, step=0, time_s=0.0)
    with pytest.raises(ConfigError, match="time_s"):
        StepReport(rank=0, step=0, time_s=math.nan)
    with pytest.raises(ConfigError, match="phase"):
        StepReport(rank=0, step=0, time_s=0.0, phase="")
    assert not LossSample(step=1, value="nan").finite  # type: ignore[arg-type]
    assert LossSample(step=1, value=1.5).finite
