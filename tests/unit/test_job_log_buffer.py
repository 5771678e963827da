"""The agent's buffer of job log lines for the heartbeats: pieces of whole lines with their
offsets, kept until the API has them, bounded while it does not answer."""

from __future__ import annotations

from worker.node.job_files import LogBuffer


def test_pieces_are_whole_lines_at_their_offsets_until_taken() -> None:
    buffer = LogBuffer(piece_chars=32)
    assert buffer.take() is None
    for i in range(5):
        buffer.add(f"line {i} é")  # é: offsets count bytes, as the server does
    first = buffer.take()
    assert first == (0, "line 0 é\nline 1 é\nline 2 é\n")  # 27 characters: a fourth won't fit
    assert buffer.take() == first  # not acknowledged yet: the same piece again
    buffer.taken(first)
    second = buffer.take()
    assert second == (len(first[1].encode()), "line 3 é\nline 4 é\n")
    buffer.taken(first)  # a late acknowledgement of an older piece changes nothing
    assert buffer.take() == second
    buffer.taken(second)
    assert buffer.take() is None and buffer.offset == 5 * len("line 0 é\n".encode())


def test_a_long_line_is_cut_and_pending_lines_are_bounded_saying_how_much_went() -> None:
    buffer = LogBuffer(max_pending=100, piece_chars=40)
    buffer.add("x" * 500)
    assert buffer.take() == (0, "x" * 39 + "\n")
    for i in range(20):  # the API does not answer: only the newest ~100 bytes stay
        buffer.add(f"step {i:02d}")
    offset, text = buffer.take()  # type: ignore[misc]
    assert offset == 0
    assert text.startswith("[") and "bytes of log dropped while the API did not answer" in text
    rest = []
    while (piece := buffer.take()) is not None:
        buffer.taken(piece)
        rest.append(piece[1])
    assert "".join(rest).endswith("step 19\n") and "step 00" not in "".join(rest)
