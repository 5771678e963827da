"""The dashboard through the ASGI app on real SQLite and PostgreSQL: every page renders valid
HTML, logins and roles hold, actions need a CSRF token, hostile strings stay text."""

from __future__ import annotations

import csv
import io
import json
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from service.app import create_app
from service.auth import tokens as auth
from service.config import Settings
from service.dashboard import issue_login_url
from service.dashboard.session import SECRET_FILE
from service.persistence.migrate import upgrade
from service.persistence.models import Run, Worker
from tests.integration import dashboard_world
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import DIVERGENT, HOSTILE, HOSTILE_ENV, HOSTILE_ERROR, World

html5lib = pytest.importorskip("html5lib", reason="html5lib is not installed (test extra)")


@pytest.fixture(params=["sqlite", "postgresql"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    settings.data_dir.mkdir(mode=0o755)
    upgrade(settings.resolved_database_url)
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def world(app: Any, tmp_path: Path) -> World:
    with app.state.sessionmaker() as db:
        return dashboard_world.build(db, tmp_path / "artifacts", app.state.settings)


@pytest.fixture
def browser(app: Any) -> Iterator[AsgiBrowser]:
    b = AsgiBrowser(app)
    yield b
    b.close()


def logged_in(browser: AsgiBrowser, token: str) -> AsgiBrowser:
    answer = browser.login(token)
    assert answer.status_code == 303, answer.text
    return browser


def strict_parse(html: str, container: str | None = None) -> None:
    parser = html5lib.HTMLParser(strict=True)
    if container:
        parser.parseFragment(html, container=container)
    else:
        parser.parse(html)


def strict_parse_live_rows(html: str) -> None:
    """The live-rows fragment: a poller, and rows in <template>s swapped in out of band
    (html5lib does not read template contents, so each row is parsed as table content)."""
    rows = re.findall(r"<template>(.*?)</template>", html, flags=re.S)
    strict_parse(re.sub(r"<template>.*?</template>", "", html, flags=re.S), container="div")
    for row in rows:
        strict_parse(row, container="tbody")


def pages(w: World) -> list[str]:
    return [
        "/",
        "/?status=succeeded&verdict=&experiment=&worker=&kind=train&spec=&fingerprint=",
        "/?verdict=diverged",
        "/?verdict=reference",
        "/?verdict=pending",
        f"/?experiment={w.experiment}&worker={w.worker}",
        "/?kind=refine",
        f"/runs/{w.reference}",
        f"/runs/{w.diverged}",
        f"/runs/{w.failed}",
        f"/runs/{w.running}",
        f"/compare?a={w.reference}&b={w.diverged}",
        f"/compare?a={w.reference}&b={w.diverged}&env=all",
        f"/compare?a={w.reference}&b={w.identical}",
        f"/compare/runs?runs={w.reference},{w.identical},{w.diverged},{w.failed},{w.running}",
        f"/experiments/{w.experiment}",
        f"/runs/{w.reference}/certificate",
        f"/audits/{w.audit}",
        "/audits",
        "/workers",
    ]


def test_every_page_renders_valid_html_with_hostile_strings_as_text(
    world: World, browser: AsgiBrowser
) -> None:
    logged_in(browser, world.admin_token)
    for url in pages(world):
        page = browser.get(url)
        assert page.status_code == 200, (url, page.text[:500])
        assert page.headers["content-type"].startswith("text/html")
        strict_parse(page.text)
        for hostile in (HOSTILE, HOSTILE_ERROR, HOSTILE_ENV):
            assert hostile not in page.text, url
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert escaped in browser.get("/").text
    assert escaped in browser.get(f"/experiments/{world.experiment}").text
    failed = browser.get(f"/runs/{world.failed}").text
    assert "&lt;img src=x onerror=" in failed and "Traceback (most recent call last)" in failed
    assert "&lt;/td&gt;&lt;script&gt;alert(3)" in browser.get(f"/runs/{world.reference}").text
    # The login form itself, and a viewer whose token name is hostile.
    browser.post("/logout", data={"csrf": browser.csrf()})
    strict_parse(browser.get("/login").text)
    logged_in(browser, world.viewer_token)
    runs = browser.get("/").text
    assert HOSTILE not in runs and escaped in runs


def test_runs_page_shows_every_verdict_badge_and_running_rows_poll(
    world: World, browser: AsgiBrowser, app: Any
) -> None:
    logged_in(browser, world.admin_token)
    page = browser.get("/").text
    assert "diverged at e2/s8" in page
    for kind in ("identical", "reference", "pending"):
        assert f'class="badge {kind}"' in page
    # Only the unfinished runs are polled, through one small fragment.
    poll = re.search(r'hx-get="/runs/live\?ids=([0-9,]+)"', page)
    assert poll is not None
    with app.state.sessionmaker() as db:
        unfinished = set(db.scalars(select(Run.id).where(Run.status.in_(("queued", "running")))))
    assert set(map(int, poll.group(1).split(","))) == unfinished
    fragment = browser.get(f"/runs/live?ids={poll.group(1)}")
    assert fragment.status_code == 200
    strict_parse_live_rows(fragment.text)
    assert f'id="run-{world.running}"' in fragment.text and 'hx-swap-oob="true"' in fragment.text
    finished = browser.get(f"/runs/live?ids={world.reference}").text
    assert "hx-trigger" not in finished  # nothing left to poll: polling stops
    assert browser.get("/runs/live?ids=" + ",".join(["1"] * 201)).status_code == 400
    # Polling is bounded: after 30 minutes of polls the page asks for a reload instead.
    late = browser.get(f"/runs/live?ids={world.running}&n=900").text
    assert "hx-trigger" not in late.split("<template>")[0] and "Live updates paused" in late
    late_run = browser.get(f"/runs/{world.running}/live?n=900").text
    assert "hx-trigger" not in late_run and "Live updates paused" in late_run


def test_a_live_run_page_gets_its_whole_content_when_the_run_changes_state(
    world: World, browser: AsgiBrowser, app: Any
) -> None:
    logged_in(browser, world.admin_token)
    page = browser.get(f"/runs/{world.running}").text
    shown = re.search(r"hx-vals='\{\"shown\": \"([a-z0-9-]+)\"\}'", page)
    assert shown is not None, page
    state = shown.group(1)
    assert state.startswith("running-")
    assert "epoch 1 of 3" in page and "Cancel" in page
    same = browser.get(f"/runs/{world.running}/live", params={"shown": state})
    assert "HX-Retarget" not in same.headers and same.text.lstrip().startswith("<div")
    with app.state.sessionmaker() as db:
        run = db.get(Run, world.running)
        worker = db.scalar(select(Worker).where(Worker.name == world.worker))
        assert run is not None and worker is not None
        dashboard_world.finish(db, run, worker)
    changed = browser.get(f"/runs/{world.running}/live", params={"shown": state})
    assert changed.headers["HX-Retarget"] == "main"
    assert changed.headers["HX-Reswap"] == "innerHTML"
    strict_parse(changed.text, container="main")
    assert run.final_fingerprint is not None and run.final_fingerprint in changed.text
    assert "no trace yet" not in changed.text and "/cancel" not in changed.text
    assert "hx-trigger" not in changed.text  # final: nothing left to poll
    assert browser.get(f"/runs/{world.running}/live?shown=x%22").status_code == 422


def test_a_copy_that_finished_first_stays_live_until_the_older_one_decides_its_verdict(
    world: World, browser: AsgiBrowser, app: Any
) -> None:
    logged_in(browser, world.admin_token)
    first, second = world.audit, world.audit + 1  # an audit's two copies, one family
    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker).where(Worker.name == world.worker)).one()
        dashboard_world.finish(db, db.get_one(Run, second), worker)
    # The newer copy finished first: the reference for now, and still polled.
    row = browser.get(f"/runs/live?ids={second}").text
    assert 'class="badge reference"' in row and f"ids={second}" in row
    assert str(second) in re.search(r'hx-get="/runs/live\?ids=([0-9,]+)"', browser.get("/").text)[1]
    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker).where(Worker.name == world.worker)).one()
        dashboard_world.finish(db, db.get_one(Run, first), worker, diverge_at=2)
    # The older one decided it: diverged against it, and polling stops.
    row = browser.get(f"/runs/live?ids={second}").text
    assert "diverged at e2/s8" in row and "hx-trigger" not in row


def test_run_and_compare_pages_show_seed_fingerprint_marks_and_divergence(
    world: World, browser: AsgiBrowser, app: Any
) -> None:
    logged_in(browser, world.admin_token)
    with app.state.sessionmaker() as db:
        diverged = db.get_one(Run, world.diverged)
        fingerprint = diverged.final_fingerprint
    page = browser.get(f"/runs/{world.diverged}").text
    assert '<td class="mono seed">42, 0</td>' in page
    assert fingerprint is not None and fingerprint in page
    assert page.count("= equal") == 2 and page.count("≠ different") == 2  # init, e1 | e2, e3
    assert "Thread counts were left to the machine" in page
    compare = browser.get(f"/compare?a={world.reference}&b={world.diverged}").text
    outlined = re.findall(
        r'<rect class="cell differs first-divergence" data-variable="([^"]+)"', compare
    )
    assert outlined == [DIVERGENT]
    assert "cause: compute" in compare and "Refine to the step" in compare
    assert "No recorded environment field differs." in compare
    everything = browser.get(f"/compare?a={world.reference}&b={world.diverged}&env=all").text
    assert "libraries.tensorflow" in everything and "= same" in everything


def test_a_seed_change_is_named_as_the_cause_on_the_page_and_at_the_api(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    """Another seed: initial weights and every epoch's data differ. The page once said
    "cause: compute" with "data equal"; it names the spec's seed and offers no refinement."""
    from service.runs.experiments import create_experiment
    from worker.spec import ExperimentSpec

    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker)).one()
        spec = ExperimentSpec.model_validate({**dashboard_world.spec_doc(), "seed": 43})
        _, reseeded, _ = create_experiment(db=db, spec=spec, settings=app.state.settings)
        dashboard_world.finish(db, reseeded, worker, diverge_at=0)
        reseeded.data_fingerprints = [
            {"epoch": e, "fingerprint": f"sha256:{e:064x}"} for e in (1, 2, 3)
        ]
        db.commit()
        other = reseeded.id
    logged_in(browser, world.admin_token)
    compare = browser.get(f"/compare?a={world.reference}&b={other}").text
    assert "cause: spec (seed)" in compare
    assert "data equal" not in compare and "Refine to the step" not in compare
    assert "different seeds" in compare
    report = browser.get(
        f"/api/v1/compare?a={world.reference}&b={other}",
        headers={"Authorization": f"Bearer {world.admin_token}"},
    ).json()
    assert report["cause"] == "seed" and report["data_epochs_differing"] == [1, 2, 3]


def test_audits_have_an_index_and_copies_on_one_worker_say_what_they_prove(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    """`/audits` once answered a raw JSON 404; an audit was reachable only from its copies.
    Copies that all ran on one worker said "1 distinct workers" without a caveat."""
    logged_in(browser, world.admin_token)
    index = browser.get("/audits")
    assert index.status_code == 200 and f'href="/audits/{world.audit}"' in index.text
    assert 'href="/audits">Audits</a>' in index.text  # in the navigation
    assert "running" in index.text and "one machine" not in index.text
    with app.state.sessionmaker() as db:
        worker = db.scalars(select(Worker)).one()
        for run in db.scalars(select(Run).where(Run.audit_id == world.audit)).all():
            run.status = "queued"
            dashboard_world.finish(db, run, worker)
    index = browser.get("/audits").text
    assert "all agree" in index and "one machine" in index
    page = browser.get(f"/audits/{world.audit}").text
    assert re.search(r"2 copies on 1 distinct worker(?!s)", page)
    assert "not across machines" in page
    listed = browser.get(
        "/api/v1/repro-audits", headers={"Authorization": f"Bearer {world.viewer_token}"}
    ).json()
    assert [a["id"] for a in listed] == [world.audit]
    assert listed[0]["agree"] is True and "one worker" in listed[0]["caveat"]


def test_without_a_session_pages_redirect_to_login_and_fragments_answer_401(
    world: World, browser: AsgiBrowser
) -> None:
    for url in [*pages(world), "/runs/export.csv"]:
        answer = browser.get(url)
        assert answer.status_code == 303, url
        assert answer.headers["location"].startswith("/login?next=")
    partial = browser.get(f"/runs/{world.running}/live", headers={"HX-Request": "true"})
    assert partial.status_code == 401
    posted = browser.post(f"/runs/{world.reference}/rerun", data={"csrf": "x"})
    assert posted.status_code == 303 and posted.headers["location"].startswith("/login")


def _run_count(app: Any) -> int:
    with app.state.sessionmaker() as db:
        return int(db.scalar(select(func.count(Run.id))) or 0)


def test_a_viewer_may_look_but_not_act(world: World, browser: AsgiBrowser, app: Any) -> None:
    logged_in(browser, world.viewer_token)
    page = browser.get(f"/runs/{world.reference}")
    assert page.status_code == 200 and "may look, not act" in page.text
    csrf = browser.csrf()
    before = _run_count(app)
    for url, form in [
        (f"/runs/{world.reference}/rerun", {}),
        (f"/runs/{world.running}/cancel", {}),
        (f"/runs/{world.reference}/audit", {"copies": "2"}),
        ("/compare/refine", {"a": str(world.reference), "b": str(world.diverged)}),
    ]:
        answer = browser.post(url, data={"csrf": csrf, **form})
        assert answer.status_code == 403, url
        strict_parse(answer.text)
    assert _run_count(app) == before


def test_actions_need_the_sessions_csrf_token(world: World, browser: AsgiBrowser, app: Any) -> None:
    logged_in(browser, world.submitter_token)
    before = _run_count(app)
    assert browser.post(f"/runs/{world.reference}/rerun").status_code == 403
    assert (
        browser.post(f"/runs/{world.reference}/rerun", data={"csrf": "0" * 64}).status_code == 403
    )
    assert _run_count(app) == before
    csrf = browser.csrf(f"/runs/{world.reference}")
    rerun = browser.post(f"/runs/{world.reference}/rerun", data={"csrf": csrf})
    assert rerun.status_code == 303
    new_id = int(rerun.headers["location"].rsplit("/", 1)[1])
    assert _run_count(app) == before + 1
    page = browser.get(f"/runs/{new_id}").text
    assert 'class="badge pending"' in page and f'hx-get="/runs/{new_id}/live?n=0"' in page
    cancelled = browser.post(f"/runs/{new_id}/cancel", data={"csrf": csrf})
    assert cancelled.status_code == 303
    assert "cancelled" in browser.get(f"/runs/{new_id}/live").text
    again = browser.post(f"/runs/{new_id}/cancel", data={"csrf": csrf})
    assert again.status_code == 409 and "already cancelled" in again.text
    audit = browser.post(f"/runs/{world.reference}/audit", data={"csrf": csrf, "copies": "3"})
    assert audit.status_code == 303 and audit.headers["location"].startswith("/audits/")
    audit_page = browser.get(audit.headers["location"]).text
    assert audit_page.count('href="/runs/') == 3
    bad = browser.post(f"/runs/{world.reference}/audit", data={"csrf": csrf, "copies": "99"})
    assert bad.status_code == 400
    # Refine to the step: two re-traces queued, shown on the comparison.
    pair = {"a": str(world.reference), "b": str(world.diverged)}
    refined = browser.post("/compare/refine", data={"csrf": csrf, **pair})
    assert refined.status_code == 303 and "&refinement=" in refined.headers["location"]
    shown = browser.get(refined.headers["location"]).text
    assert "step by step" in shown and shown.count("re-trace run") == 2
    strict_parse(shown)
    # Another session's token does not work in this one.
    other = AsgiBrowser(app)
    try:
        other_csrf = logged_in(other, world.admin_token).csrf()
    finally:
        other.close()
    assert other_csrf != csrf
    assert (
        browser.post(f"/runs/{world.reference}/rerun", data={"csrf": other_csrf}).status_code == 403
    )


def test_login_cookie_logout_and_revocation(world: World, app: Any) -> None:
    plain, secure = AsgiBrowser(app), AsgiBrowser(app, base_url="https://dashboard.test")
    try:
        wrong = plain.login("rpt_1_" + "x" * 43)
        assert wrong.status_code == 401 and "Not logged in" in wrong.text
        with app.state.sessionmaker() as db:
            _, worker_token = auth.create_token(db=db, name="w", role="worker")
        assert plain.login(worker_token).status_code == 403
        no_form_token = plain.post("/login", data={"token": world.admin_token})
        assert no_form_token.status_code == 403 and "repro_session" not in str(
            no_form_token.headers.get("set-cookie")
        )
        ok = plain.login(world.submitter_token)
        cookie = ok.headers["set-cookie"]
        assert "repro_session=" in cookie and "HttpOnly" in cookie
        assert "SameSite=lax" in cookie and "Secure" not in cookie
        assert world.submitter_token not in cookie
        secure_cookie = secure.login(world.admin_token).headers["set-cookie"]
        assert "Secure" in secure_cookie and "HttpOnly" in secure_cookie
        # After login, back to the page asked for; never to another site.
        form = plain.get("/login?next=//evil.example/x").text
        assert 'name="next" value="/"' in form
        assert plain.get("/").status_code == 200
        logout = plain.post("/logout", data={"csrf": plain.csrf()})
        assert logout.status_code == 303
        assert plain.get("/").status_code == 303
        # Revoking the token ends its sessions at once.
        assert plain.login(world.submitter_token).status_code == 303
        with app.state.sessionmaker() as db:
            admin = auth.verify(db, world.admin_token)
            auth.revoke(
                db=db, token_id=auth.verify(db, world.submitter_token).token_id, actor=admin
            )
        assert plain.get("/").status_code == 303
    finally:
        plain.close()
        secure.close()


def test_secret_is_owner_only_and_login_links_work_once(world: World, app: Any) -> None:
    data_dir: Path = app.state.settings.data_dir
    assert stat.S_IMODE((data_dir / SECRET_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    link = issue_login_url(app, "http://dashboard.test", world.admin_token)
    path = link.removeprefix("http://dashboard.test")
    first, second = AsgiBrowser(app), AsgiBrowser(app)
    try:
        used = first.get(path)
        assert used.status_code == 303 and "repro_session=" in used.headers["set-cookie"]
        assert first.get("/").status_code == 200
        reused = second.get(path)
        assert reused.status_code == 401 and "already used" in reused.text
        assert second.get("/").status_code == 303
    finally:
        first.close()
        second.close()


def test_keyset_pages_walk_every_run_once_both_ways(
    world: World, browser: AsgiBrowser, app: Any
) -> None:
    logged_in(browser, world.admin_token)
    with app.state.sessionmaker() as db:
        expected = list(
            db.scalars(select(Run.id).where(Run.kind == "train").order_by(Run.id.desc()))
        )
    seen: list[int] = []
    last: list[int] = []
    url: str | None = "/?limit=2"
    pages_back: list[str] = []
    while url is not None:
        page = browser.get(url.replace("&amp;", "&")).text
        last = [int(i) for i in re.findall(r'<tr id="run-(\d+)"', page)]
        assert 0 < len(last) <= 2
        seen += last
        older = re.search(r'<a href="([^"]+)" rel="next">', page)
        newer = re.search(r'<a href="([^"]+)" rel="prev">', page)
        if newer:
            pages_back.append(newer.group(1))
        url = older.group(1) if older else None
    assert seen == expected
    back = browser.get(pages_back[-1].replace("&amp;", "&")).text
    # Newer than the last page: the two runs just before its first one.
    at = expected.index(last[0])
    assert [int(i) for i in re.findall(r'<tr id="run-(\d+)"', back)] == expected[at - 2 : at]


def test_export_streams_the_filtered_set(world: World, browser: AsgiBrowser, app: Any) -> None:
    logged_in(browser, world.admin_token)
    answer = browser.get("/runs/export.csv")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert len(rows) == _run_count(app)
    assert {r["experiment"] for r in rows} == {HOSTILE}  # data, exported as it is
    diverged = json.loads(browser.get("/runs/export.json?verdict=diverged").text)
    assert [(r["id"], r["verdict"]) for r in diverged] == [(world.diverged, "diverged")]
    assert diverged[0]["seed"] == [42, 0]


def test_artifacts_download_with_the_session(world: World, browser: AsgiBrowser) -> None:
    logged_in(browser, world.viewer_token)
    page = browser.get(f"/runs/{world.reference}").text
    link = f"/runs/{world.reference}/artifacts/{world.artifact}"
    assert link in page
    answer = browser.get(link)
    assert answer.status_code == 200 and answer.content == b"final weights " + HOSTILE.encode()
    assert answer.headers["content-type"] == "application/octet-stream"
    assert browser.get(f"/runs/{world.diverged}/artifacts/{world.artifact}").status_code == 404
    missing = browser.get("/runs/999999")
    assert missing.status_code == 404 and "run 999999 does not exist" in missing.text
    strict_parse(missing.text)


def test_the_run_page_leads_with_final_metrics_and_parameters_and_folds_long_provenance(
    world: World, browser: AsgiBrowser
) -> None:
    """The run page was 6,000 px of flat provenance with no final metrics or parameters."""
    logged_in(browser, world.viewer_token)
    page = browser.get(f"/runs/{world.reference}").text
    metrics = page.index("<h3>Final metrics</h3>")
    assert metrics < page.index("<h2>Provenance</h2>")
    assert '<th class="mono">training.optimizer.params.learning_rate</th>' in page
    assert re.search(r"<th>accuracy</th><td class=\"num\">0\.575", page), page[metrics:][:600]
    # Long groups start folded: the environment's keyed digests do not fill the page.
    folded = re.search(r'<details class="group[^"]*"><summary><h3>Environment variables', page)
    assert folded is not None
