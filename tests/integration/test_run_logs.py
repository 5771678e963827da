"""A job's log on the server (the worker sends it with heartbeats): kept once per offset,
bounded per attempt with the newest lines kept, read from an offset through the API, shown
on the run page with its live poll, and whole as text; on real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from service.runs import logs
from tests.integration import test_dashboard_pages as pages
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World

app, world, browser, logged_in = pages.app, pages.world, pages.browser, pages.logged_in


def _lines(first: int, count: int) -> str:
    return "".join(f"epoch {i}: loss 0.{i:04d}\n" for i in range(first, first + count))


def test_pieces_are_kept_once_bounded_and_read_from_an_offset(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    run_id = world.running
    one, two = _lines(0, 3), _lines(3, 2)
    with app.state.sessionmaker() as db:
        for offset, text in ((0, one), (0, one), (len(one), two), (0, one)):  # repeats add nothing
            logs.append(db, run_id=run_id, attempt=1, offset=offset, text=text, max_bytes=4096)
        db.commit()
    headers = {"Authorization": f"Bearer {world.viewer_token}"}

    def read(**params: Any) -> dict[str, Any]:
        answer = browser.get(f"/api/v1/runs/{run_id}/log", params=params, headers=headers)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    whole = read()
    assert whole["text"] == one + two and whole["attempts"] == [1] and whole["running"]
    assert (whole["start"], whole["end"], whole["dropped"]) == (0, len(one + two), 0)
    assert read(after=len(one))["text"] == two  # a follower gets only what is new
    assert read(after=whole["end"])["text"] == ""

    logged_in(browser, world.viewer_token)
    page = browser.get(f"/runs/{run_id}").text
    assert "epoch 4: loss 0.0004" in page.split('id="job-log"', 1)[1]
    assert f'hx-get="/runs/{run_id}/log/live?n=0"' in page  # it trains: the box polls
    live = browser.get(f"/runs/{run_id}/log/live", params={"n": 3}).text
    assert "epoch 4" in live and "/log/live?n=4" in live
    assert browser.get(f"/runs/{run_id}/log.txt").text == one + two

    # Past the bound, the oldest pieces go and the newest stay; a new attempt has its own.
    with app.state.sessionmaker() as db:
        offset = whole["end"]
        for first in range(5, 405, 20):
            text = _lines(first, 20)
            logs.append(db, run_id=run_id, attempt=1, offset=offset, text=text, max_bytes=4096)
            offset += len(text)
        logs.append(db, run_id=run_id, attempt=2, offset=0, text="resumed\n", max_bytes=4096)
        db.commit()
    first_attempt = read(attempt=1)
    assert first_attempt["dropped"] > 0 and len(first_attempt["text"]) <= 4096
    assert first_attempt["text"].endswith("epoch 404: loss 0.0404\n")
    assert first_attempt["end"] == offset
    assert read()["text"] == "resumed\n" and read()["attempts"] == [1, 2]
    text = browser.get(f"/runs/{run_id}/log.txt", params={"attempt": 1}).text
    assert text.startswith(f"[the first {first_attempt['dropped']} bytes")
    assert f'href="/runs/{run_id}/log.txt?attempt=1"' in browser.get(f"/runs/{run_id}").text


def test_a_run_without_a_log_says_so(world: World, browser: AsgiBrowser) -> None:
    headers = {"Authorization": f"Bearer {world.viewer_token}"}
    answer = browser.get(f"/api/v1/runs/{world.reference}/log", headers=headers).json()
    assert answer["attempt"] is None and answer["text"] == "" and not answer["running"]
    logged_in(browser, world.viewer_token)
    page = browser.get(f"/runs/{world.reference}").text
    assert "The job wrote nothing to its log" in page
    assert f"/runs/{world.reference}/log/live" not in page  # ended: nothing to poll
    missing = browser.get("/api/v1/runs/999999/log", headers=headers)
    assert missing.status_code == 404
