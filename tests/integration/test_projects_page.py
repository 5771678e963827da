"""The projects page: experiments grouped by name (a learning-rate sweep is one project of
several experiments), with run counts, a link to the project's runs and one comparing the
latest run of each of its experiments; filtered and paged by name, on SQLite and PostgreSQL."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from markupsafe import escape

from service.dashboard import projects_page
from tests.integration import test_dashboard_pages as pages
from tests.integration.asgi_browser import AsgiBrowser
from tests.integration.dashboard_world import World
from tests.integration.test_run_labels import _experiment

app, world, browser, logged_in = pages.app, pages.world, pages.browser, pages.logged_in


def _row(page: str, name: str) -> str:
    for row in re.findall(r'<tr class="project">(.*?)</tr>', page, re.S):
        if f">{escape(name)}</a>" in row:
            return str(row)
    raise AssertionError(f"no project {name!r} on the page")


def test_a_sweep_is_one_project_with_its_runs_and_a_comparison(
    app: Any, world: World, browser: AsgiBrowser, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = _experiment(app, lr=0.001, epochs=2, name="sweep it's")
    fast = _experiment(app, lr=0.01, epochs=2, name="sweep it's")
    other = _experiment(app, lr=0.01, epochs=2, name="sweep-other")
    logged_in(browser, world.viewer_token)
    page = browser.get("/projects").text
    assert 'href="/projects">Projects</a>' in page  # the nav entry
    row = _row(page, "sweep it's")
    cells = re.findall(r'<td class="num">(?:<a [^>]*>)?(\d+)', row)
    assert cells == ["2", "2", "2"]  # experiments, runs, succeeded
    assert f'href="/runs/{fast}">#{fast}</a>' in row

    runs_link = html.unescape(re.search(r'<a href="([^"]+)" title="the runs of', row).group(1))  # type: ignore[union-attr]
    listed = browser.get(runs_link).text
    assert f'id="run-{slow}"' in listed and f'id="run-{fast}"' in listed
    assert f'id="run-{other}"' not in listed and f'id="run-{world.reference}"' not in listed

    compare = html.unescape(re.search(r'class="compare-project" href="([^"]+)"', row).group(1))  # type: ignore[union-attr]
    compared = browser.get(compare)
    assert compared.status_code == 200 and "2 runs compared" in compared.text
    assert "scatter-box" in compared.text  # the learning rate differs: plotted against metrics

    only = browser.get("/projects", params={"name": "OTHER"}).text
    assert "sweep-other" in only and "sweep it&#39;s" not in only

    monkeypatch.setattr(projects_page, "PAGE_SIZE", 1)
    first = browser.get("/projects", params={"name": "sweep"}).text
    assert re.findall(r'<tr class="project">', first) == ['<tr class="project">']
    after = html.unescape(re.search(r'href="(/projects\?[^"]+)" rel="next"', first).group(1))  # type: ignore[union-attr]
    second = browser.get(after).text
    assert "sweep-other" in second and "sweep it&#39;s" not in second
    assert 'rel="next"' not in second
