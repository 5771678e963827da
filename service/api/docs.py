"""The interactive API docs at `/docs`, from Swagger UI files shipped in the package.

No CDN: the page works offline and loads nothing from another origin. The files under
`service/static/swagger/` are swagger-ui-dist 5.35.0 from npm, unmodified (Apache-2.0,
see LICENSE and NOTICE there).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_DIR = Path(__file__).resolve().parent.parent / "static" / "swagger"
ASSETS = "/static/swagger"


def install_docs(app: FastAPI) -> None:
    """Serve `/docs` and its assets from the package."""
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_DIR), name="swagger-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API docs",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            # Swagger UI would otherwise send the schema to validator.swagger.io for a badge.
            swagger_ui_parameters={"validatorUrl": None},
        )
