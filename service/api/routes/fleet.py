"""The workers the service knows, for people and autoscalers (the worker protocol is apart)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Response
from pydantic import AfterValidator

from service.api.deps import ReadAccess, ReadSessionDep
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.runs import worker_list
from service.worker_schemas import WorkerOut

router = APIRouter(tags=["fleet"], route_class=JsonRoute)

DEFAULT_PAGE = 100  # workers a page holds unless the client asks for another size
MAX_PAGE = 500

Cursor = Annotated[
    str | None,
    Query(
        max_length=worker_list.MAX_CURSOR_CHARS,
        description="`X-Next-Cursor` of the previous page (absent: the most recently seen)",
    ),
    AfterValidator(worker_list.checked_cursor),
]


@router.get("/workers", response_model=list[WorkerOut], responses=errors(422))
def list_workers(
    db: ReadSessionDep,
    _: ReadAccess,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
    cursor: Cursor = None,
) -> list[WorkerOut]:
    """Registered workers, most recently seen first, with their images and devices, a page
    at a time.

    When there are more, the answer carries the next page's cursor in `X-Next-Cursor` and
    a `Link: <...>; rel="next"` header; pass it as `cursor`. A worker seen again while you
    page moves to the front. `devices` is the most replicas a run may ask of the worker:
    its GPUs, or for a worker without GPUs the logical CPU devices it allows
    (`cpu_devices`, `repro worker --cpu-replicas`)."""
    page = worker_list.workers_page(db, limit=limit, cursor=cursor)
    if page.next_cursor is not None:
        query = urlencode({"limit": limit, "cursor": page.next_cursor})
        response.headers["X-Next-Cursor"] = page.next_cursor
        response.headers["Link"] = f'</api/v1/workers?{query}>; rel="next"'
    return [WorkerOut.model_validate(w) for w in page.workers]
