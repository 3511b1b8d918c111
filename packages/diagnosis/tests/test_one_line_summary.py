"""`one_line_summary`: a failure's evidence in one line for logs, the whole of it kept elsewhere."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dlrover.diagnosis import one_line_summary

TRACEBACK = (
    "local rank 1 exited with exit code 1 after 2 restart(s)\n"
    "[default1]:Traceback (most recent call last):\n"
    '[default1]:  File "/job/train.py", line 9, in <module>\n'
    "[default1]:    main()\n"
    "[default1]:RuntimeError: NCCL timeout\n"
)


def test_a_traceback_is_named_by_the_first_line_and_its_exception() -> None:
    assert one_line_summary(TRACEBACK) == (
        "local rank 1 exited with exit code 1 after 2 restart(s): RuntimeError: NCCL timeout (+3 more lines)"
    )


def test_the_last_exception_wins_and_output_after_it_does_not_hide_it() -> None:
    text = (
        "worker failed\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\nKeyError: 'a'\n"
        "\nDuring handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "a.py", line 3, in <module>\nValueError: b\n'
        "[W destroy_process_group() was not called]\n"
    )
    assert one_line_summary(text).startswith("worker failed: ValueError: b (+")


def test_without_a_traceback_the_last_line_is_shown_and_one_line_is_kept_as_is() -> None:
    assert one_line_summary("exit code 137\nKilled\n") == "exit code 137: Killed"
    assert one_line_summary("  no heartbeat for 31.0s  ") == "no heartbeat for 31.0s"
    assert one_line_summary("") == ""


def test_long_lines_are_clipped() -> None:
    summary = one_line_summary("x" * 5000 + "\n" + "ValueError: " + "y" * 5000)
    assert len(summary) < 700
    assert summary.startswith("xxx")
    assert "ValueError: yyy" in summary


@given(st.text(max_size=2000))
def test_the_summary_is_always_one_line(text: str) -> None:
    summary = one_line_summary(text)
    assert "\n" not in summary
    assert "\r" not in summary
