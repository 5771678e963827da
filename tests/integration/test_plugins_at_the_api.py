"""An installed plugin at a real `repro serve`: the API knows it by name and never imports
its module, which imports TensorFlow as plugins do; its params are the job's to check."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.jobs import job_env
from tests.integration.service_procs import Service, running
from tests.integration.test_compare_runs_family import perturbable_spec


def loaded_tensorflow(pid: int) -> list[str]:
    """The TensorFlow libraries mapped into process `pid`."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if "tensorflow" in line.split()[-1]})


def test_a_plugin_spec_is_taken_without_importing_the_plugin(tmp_path: Path) -> None:
    from tests.plugin_dist import PLUGIN_DIR, make_plugin_site

    plugins = {
        "PYTHONPATH": job_env([make_plugin_site(tmp_path / "site"), PLUGIN_DIR])["PYTHONPATH"]
    }
    with running(Service(tmp_path / "data", extra=("--no-demo",), env=plugins)) as (svc, _):
        created = svc.submit(json.dumps(perturbable_spec()), "application/json")
        assert created.status_code == 201, created.text
        # Params the plugin's model would refuse are taken too: its job checks them.
        odd = {**perturbable_spec(), "model": {"architecture": "perturbed_mlp", "params": {"x": 1}}}
        assert svc.submit(json.dumps(odd), "application/json").status_code == 201
        # A name no plugin registers is still refused at once, with the names it could be.
        unknown = {**perturbable_spec(), "model": {"architecture": "perturbed_mpl", "params": {}}}
        refused = svc.submit(json.dumps(unknown), "application/json")
        assert refused.status_code == 422, refused.text
        assert "perturbed_mlp" in refused.text
        assert loaded_tensorflow(svc.proc.pid) == []
