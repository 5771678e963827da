"""The workers the service knows, for people and autoscalers (the worker protocol is apart)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ReadAccess, ReadSessionDep
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.runs import queue
from service.worker_schemas import WorkerOut

router = APIRouter(tags=["fleet"], route_class=JsonRoute)


@router.get("/workers", response_model=list[WorkerOut], responses=errors(422))
def list_workers(db: ReadSessionDep, _: ReadAccess) -> list[WorkerOut]:
    """Registered workers, most recently seen first, with their images and devices.

    `devices` is the most replicas a run may ask of the worker: its GPUs, or for a worker
    without GPUs the logical CPU devices it allows (`cpu_devices`, `repro worker
    --cpu-replicas`)."""
    return [WorkerOut.model_validate(w) for w in queue.workers_seen(db)]
