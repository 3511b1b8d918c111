"""Reading torch's `@record` error file: its format, and every way it can be missing or bad."""

from __future__ import annotations

import json
from pathlib import Path

from dlrover.launcher.error_file import read_error_file


def test_a_record_error_file_gives_the_message_then_the_call_stack(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    doc = {"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback ...\nline 3"}}}
    path.write_text(json.dumps(doc))
    assert read_error_file(path) == "ValueError: boom\nTraceback ...\nline 3"


def test_a_long_call_stack_keeps_its_end(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    stack = "x" * 20000 + "THE END"
    path.write_text(json.dumps({"message": {"message": "E: e", "extraInfo": {"py_callstack": stack}}}))
    text = read_error_file(path)
    assert text.startswith("E: e\n")
    assert text.endswith("THE END")
    assert len(text) < 10000


def test_a_plain_message_is_taken_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "written by hand"}))
    assert read_error_file(path) == "written by hand"


def test_no_file_says_nothing_and_a_bad_one_says_why(tmp_path: Path) -> None:
    assert read_error_file(tmp_path / "missing.json") == ""
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x80not json{")
    assert "not torch's error file format" in read_error_file(garbage)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"error": "elsewhere"}))
    assert "not torch's error file format" in read_error_file(wrong)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)  # deeper than the JSON parser goes, well under the size limit
    assert "not torch's error file format: RecursionError" in read_error_file(deep)
    huge_message = tmp_path / "huge_message.json"
    huge_message.write_text(json.dumps({"message": {"message": "M" * 50_000, "extraInfo": {}}}))
    assert len(read_error_file(huge_message)) == 4096
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"message": "y" * 1000}))
    assert "is over 100 bytes; not read" in read_error_file(big, limit_bytes=100)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    assert "could not be read" in read_error_file(folder)
