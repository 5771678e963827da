"""The benchmarks' fill: runs as a service in use would hold them, with ids given by the fill,
on both databases, leaving the database able to take the service's own next inserts."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from benchmarks.fill import BATCH, fill_runs
from service.config import Settings
from service.persistence.engine import make_engine
from service.persistence.models import Experiment, ExperimentParam, Run


def _experiment(name: str) -> Experiment:
    return Experiment(
        name=name, spec={}, spec_hash="h", submitted_spec_hash="h", seed=[1], seed_source="spec"
    )


def test_a_fill_gives_families_reruns_and_queued_runs_after_the_stored_ones(
    migrated_settings: Settings,
) -> None:
    url = migrated_settings.resolved_database_url
    engine = make_engine(url)
    try:
        with Session(engine) as db:  # one run stored before the fill
            db.add(Run(experiment=_experiment("before")))
            db.commit()
        # More than a batch, so ids and reruns must carry across batches.
        count = BATCH + 35
        assert fill_runs(url, count, queued=10) == count + 1
        with Session(engine) as db:
            runs = db.scalars(select(Run).order_by(Run.id)).all()
            assert [r.id for r in runs] == list(range(1, count + 2))
            filled = runs[1:]
            reruns = [r for r in filled if r.rerun_of_id is not None]
            # One run in five is a rerun of the run four places before it, in its family.
            assert len(reruns) == (count - 10) // 5
            by_id = {r.id: r for r in filled}
            for rerun in reruns:
                assert rerun.rerun_of_id is not None
                first = by_id[rerun.rerun_of_id]
                assert rerun.family_id == first.id == first.family_id
                assert rerun.experiment_id == first.experiment_id and rerun.id > first.id
                assert rerun.status == "succeeded"
            assert all(r.family_id == r.id for r in filled if r.rerun_of_id is None)
            # The newest runs are queued, without the fields of a finished run.
            queued = [r for r in filled if r.status == "queued"]
            newest = sorted(filled, key=lambda r: r.created_at)[-10:]
            assert len(queued) == 10 and {r.id for r in queued} == {r.id for r in newest}
            assert all(r.started_at is None and r.final_fingerprint is None for r in queued)
            assert {"succeeded", "failed", "queued"} <= {r.status for r in filled}
            # Every filled experiment's parameters are searchable, its learning rate one of three.
            lr = "training.optimizer.params.learning_rate"
            rates = db.execute(
                select(ExperimentParam.num, func.count())
                .where(ExperimentParam.name == lr)
                .group_by(ExperimentParam.num)
            ).all()
            experiments = len({r.experiment_id for r in filled})
            assert {n for n, _ in rates} == {0.001, 0.003, 0.01}
            assert sum(c for _, c in rates) == experiments
            # The service's next inserts get the next ids (PostgreSQL's sequences moved on).
            db.add(Run(experiment=_experiment("after")))
            db.commit()
            last = db.scalars(select(Run).order_by(Run.id.desc()).limit(1)).one()
            assert last.id == count + 2
            assert last.experiment.id == db.scalar(select(func.max(Experiment.id)))
    finally:
        engine.dispose()
