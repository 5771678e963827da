"""Per-step metrics of a result: stored with the run, in its API detail, and drawn by step on
its page beside the per-epoch curves."""

from __future__ import annotations

from typing import Any

from service.persistence.models import Run
from tests.integration import test_dashboard_pages as pages
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World

app, world, browser, logged_in = pages.app, pages.world, pages.browser, pages.logged_in


def test_step_metrics_show_in_the_detail_and_as_curves_by_step(
    app: Any, world: World, browser: AsgiBrowser
) -> None:
    rows = [{"epoch": 1 + s // 8, "step": s, "loss": 2.0 / s} for s in range(1, 33)]
    with app.state.sessionmaker() as db:
        run = db.get(Run, world.identical)
        assert run is not None and not run.step_metrics
        run.step_metrics = rows
        db.commit()
    headers = {"Authorization": f"Bearer {world.viewer_token}"}
    detail = browser.get(f"/api/v1/runs/{world.identical}", headers=headers).json()
    assert detail["step_metrics"] == rows
    logged_in(browser, world.viewer_token)
    page = browser.get(f"/runs/{world.identical}").text
    charts = page.split('class="grid charts step-curves"', 1)[1].split("</div>\n", 1)[0]
    assert "loss by step" in charts and ">step<" in charts
    # Without step rows the page draws no such chart.
    assert "step-curves" not in browser.get(f"/runs/{world.reference}").text
