"""The ``--record`` files on their own (:mod:`agentcache.proxy._record`): names, rotation, the total cap, a file or a
directory deleted under the writer, and the bodies' bytes on one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentcache.proxy._record import Exchange, encode, json_text
from agentcache.proxy._record_files import RotatingFiles


def _line(n: int, size: int = 100) -> bytes:
    """A JSONL line of exactly ``size`` bytes numbered ``n``."""
    head = f'{{"n":{n},"pad":"'
    return (head + "x" * (size - len(head) - 3) + '"}\n').encode()


def _numbers(directory: Path) -> list[list[int]]:
    """The line numbers of each recording file, oldest file first."""
    files = sorted(directory.glob("agentcache-proxy-*.jsonl"))
    return [[json.loads(ln)["n"] for ln in f.read_text().splitlines()] for f in files]


def test_files_rotate_by_size_and_the_oldest_go_past_the_total(tmp_path: Path) -> None:
    now = [1_796_000_000.0]
    files = RotatingFiles(tmp_path, max_file=350, max_total=1000, clock=lambda: now[0])
    for n in range(20):
        files.write(_line(n))
        now[0] += 1
    files.close()
    kept = _numbers(tmp_path)
    assert kept == [[12, 13, 14], [15, 16, 17], [18, 19]]  # 3 lines of 100 bytes per file; whole files go past 1000
    names = sorted(p.name for p in tmp_path.iterdir())
    assert (
        names[0] == "agentcache-proxy-20261130T005332Z-00005.jsonl"
    )  # its first line's UTC time (line 12), its number
    assert all((tmp_path / n).stat().st_mode & 0o777 == 0o600 for n in names)


def test_a_line_larger_than_a_file_gets_a_file_of_its_own(tmp_path: Path) -> None:
    files = RotatingFiles(tmp_path, max_file=250, max_total=10_000)
    for n, size in enumerate((100, 600, 100, 100)):
        files.write(_line(n, size))
    assert _numbers(tmp_path) == [[0], [1], [2, 3]]


def test_earlier_runs_files_count_and_go_first_other_files_are_never_touched(tmp_path: Path) -> None:
    earlier = RotatingFiles(tmp_path, max_file=300, max_total=10_000, clock=lambda: 1_700_000_000.0)
    for n in range(6):
        earlier.write(_line(n))
    earlier.close()
    (tmp_path / "notes.jsonl").write_bytes(b"x" * 5000)
    (tmp_path / "agentcache-proxy-keep.txt").write_bytes(b"x" * 5000)
    later = RotatingFiles(tmp_path, max_file=300, max_total=700, clock=lambda: 1_800_000_000.0)
    for n in range(100, 104):
        later.write(_line(n))
    assert _numbers(tmp_path) == [[3, 4, 5], [100, 101, 102], [103]]  # 700 bytes: the earlier run's first file went
    assert (tmp_path / "notes.jsonl").stat().st_size == 5000 and (tmp_path / "agentcache-proxy-keep.txt").exists()


def test_files_of_one_second_sort_by_number_not_by_text(tmp_path: Path) -> None:
    for seq in (99_999, 100_000):
        (tmp_path / f"agentcache-proxy-20260101T000000Z-{seq:05d}.jsonl").write_bytes(_line(seq, 400))
    files = RotatingFiles(tmp_path, max_file=400, max_total=800, clock=lambda: 1_900_000_000.0)
    files.write(_line(1, 400))
    assert _numbers(tmp_path) == [[100_000], [1]]


def test_a_file_or_directory_deleted_under_the_writer_is_started_again(tmp_path: Path) -> None:
    directory = tmp_path / "rec"
    files = RotatingFiles(directory, max_file=10_000, max_total=100_000)
    files.write(_line(0))
    assert files.current is not None
    files.current.unlink()  # a cleanup job took the open file: the next line must not go to a deleted inode
    files.write(_line(1))
    assert _numbers(directory) == [[1]]
    shutil.rmtree(directory)
    files.write(_line(2))
    assert _numbers(directory) == [[2]] and directory.stat().st_mode & 0o777 == 0o700


def test_bodies_are_spliced_in_as_their_bytes_on_one_line() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Zürich\u2028🛫"}]}
    pretty = json.dumps(body, indent=1, ensure_ascii=False).replace("\n", "\r\n").encode()
    assert json_text(pretty) == pretty.replace(b"\r\n", b"  ")
    assert json_text(b"\xef\xbb\xbf" + pretty) == pretty.replace(b"\r\n", b"  ")  # a byte order mark dropped
    utf16 = json.dumps(body).encode("utf-16")  # json reads it; the line must be UTF-8
    assert json.loads(json_text(utf16)) == body and json_text(utf16).isascii()
    line = encode(Exchange({"session": "s", "id": "\ud800"}, pretty, b'{"a":1}'))
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc == {"session": "s", "id": "\ud800", "body": body, "sent": {"a": 1}}
    assert list(doc) == ["session", "id", "body", "sent"]  # the bodies last: a head is read without them
