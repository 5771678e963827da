"""Environment variables in provenance: values for the numerics list, keyed digests for the rest."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.auth.provenance_key import claim_provenance, provenance_key
from service.config import Settings
from worker.compare.verdict import _environment_sentence
from worker.record import environment_capture as env_capture
from worker.record.provenance import capture_provenance, diff_provenance, relevant_environment

KEY = b"k" * 32
# Long, unlikely strings: finding one anywhere in a record can only mean it leaked.
FAST_MATH = "fast-math-value-8c1f0e6a"
SECRET = "hunter2-secret-value-5b7d93"


def _capture(environ: dict[str, str], key: bytes = KEY) -> dict[str, Any]:
    values, digests = env_capture.capture_environment(environ, key=key)
    return {"environment": values, "environment_digests": digests}


def test_listed_variables_keep_values_and_every_other_only_a_keyed_digest() -> None:
    environ = {
        "TF_DETERMINISTIC_OPS": "1",
        "TF_NUM_INTRAOP_THREADS": "2",
        "TF_CUDNN_USE_AUTOTUNE": "0",
        "OMP_NUM_THREADS": "4",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "XLA_FLAGS": "--xla_cpu_enable_fast_math=false",
        "PYTHONHASHSEED": "0",
        "TF_CLI_CONFIG_FILE": "/home/u/.terraformrc",  # Terraform's, not TensorFlow's
        "MYLIB_FAST_MATH": FAST_MATH,
        "REPRO_LEASE_SECONDS": "30",
        "HOME": "/home/u",
    }
    record = _capture(environ)
    assert record["environment"] == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "OMP_NUM_THREADS": "4",
        "PYTHONHASHSEED": "0",
        "TF_CUDNN_USE_AUTOTUNE": "0",
        "TF_DETERMINISTIC_OPS": "1",
        "TF_NUM_INTRAOP_THREADS": "2",
        "XLA_FLAGS": "--xla_cpu_enable_fast_math=false",
    }
    hidden = record["environment_digests"]["variables"]
    assert sorted(hidden) == [
        "HOME",
        "MYLIB_FAST_MATH",
        "REPRO_LEASE_SECONDS",
        "TF_CLI_CONFIG_FILE",
    ]
    assert all(d.startswith("hmac-sha256:") and len(d) == 12 + 64 for d in hidden.values())
    text = json.dumps(record)
    assert FAST_MATH not in text and ".terraformrc" not in text and "/home/u" not in text


def test_a_low_entropy_value_is_not_a_plain_hash_and_depends_on_key_and_name() -> None:
    digest = env_capture.keyed_digest(KEY, "MYLIB_FAST_MATH", "1")
    plain = hashlib.sha256(b"1").hexdigest()
    assert plain not in digest and hashlib.sha256(b"MYLIB_FAST_MATH\x001").hexdigest() not in digest
    assert digest == env_capture.keyed_digest(KEY, "MYLIB_FAST_MATH", "1")
    assert digest != env_capture.keyed_digest(KEY, "MYLIB_FAST_MATH", "0")
    assert digest != env_capture.keyed_digest(KEY, "OTHER_FLAG", "1")
    assert digest != env_capture.keyed_digest(b"another key", "MYLIB_FAST_MATH", "1")


@pytest.mark.parametrize(
    "name", ["REPRO_API_TOKEN", "TF_GPU_SECRET", "CUDA_LICENSE_KEY", "OMP_PASSWORD", "db_passwd"]
)
def test_a_secret_looking_name_is_only_a_digest_even_on_the_list(name: str) -> None:
    record = _capture({name: SECRET, "OMP_NUM_THREADS": "1"})
    assert record["environment"] == {"OMP_NUM_THREADS": "1"}
    assert list(record["environment_digests"]["variables"]) == [name]
    assert SECRET not in json.dumps(record)


def test_credentials_inside_a_listed_url_value_are_masked() -> None:
    record = _capture({"TF_CONFIG": "grpc://user:pw@chief:2222"})
    assert record["environment"] == {"TF_CONFIG": "grpc://***@chief:2222"}


def test_the_shells_bookkeeping_and_the_key_itself_are_not_recorded() -> None:
    environ = {"PWD": "/x", "OLDPWD": "/y", "SHLVL": "2", "_": "/usr/bin/python"}
    environ |= {"REPRO_JOB_REEXEC": "1", env_capture.KEY_ENV: "handed-key-value", "LANG": "C"}
    record = _capture(environ)
    assert record["environment"] == {}
    assert list(record["environment_digests"]["variables"]) == ["LANG"]
    assert "handed-key-value" not in json.dumps(record)


def test_the_operators_list_adds_names_and_prefixes_with_values() -> None:
    environ = {
        env_capture.NUMERIC_ENV: "MYLIB_*, OTHER_FLAG",
        "MYLIB_FAST_MATH": "1",
        "OTHER_FLAG": "on",
        "MYLIB_API_TOKEN": SECRET,
        "UNRELATED": "x",
    }
    record = _capture(environ)
    assert record["environment"] == {"MYLIB_FAST_MATH": "1", "OTHER_FLAG": "on"}
    digests = record["environment_digests"]
    assert digests["numeric_extra"] == ["MYLIB_*", "OTHER_FLAG"]
    assert sorted(digests["variables"]) == ["MYLIB_API_TOKEN", "UNRELATED"]


def test_name_lists_parse_from_commas_or_json_and_refuse_what_is_no_name() -> None:
    assert env_capture.parse_name_list(' ["B", "A_*"] ') == ["A_*", "B"]
    assert env_capture.parse_name_list("A, B C") == ["A", "B", "C"]
    assert env_capture.parse_name_list("") == []
    with pytest.raises(ValueError, match="1BAD"):
        env_capture.parse_name_list("GOOD,1BAD")
    with pytest.raises(ValidationError):
        Settings(numeric_env_vars="NOT A*NAME")
    assert Settings(numeric_env_vars="MYLIB_*, X").numeric_env_vars == "MYLIB_*,X"


def test_a_local_run_uses_the_data_directorys_key_created_once_owner_only(
    tmp_path: Path,
) -> None:
    environ = {"REPRO_DATA_DIR": str(tmp_path / "data")}
    key, source = env_capture.job_key(environ)
    path = tmp_path / "data" / env_capture.KEY_FILE
    assert source == "local" and path.read_text().strip().encode() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert env_capture.job_key(environ) == (key, "local")
    assert env_capture.job_key({**environ, env_capture.KEY_ENV: "abc"}) == (b"abc", "handed")
    first = _capture({**environ, "MYLIB_FAST_MATH": "1"}, key=key)
    _, again = env_capture.capture_environment({**environ, "MYLIB_FAST_MATH": "1"})
    assert again == {**first["environment_digests"], "key_source": "local"}


def test_the_service_key_is_shared_with_local_runs_of_its_data_directory(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", numeric_env_vars="MYLIB_*")
    key = provenance_key(settings)
    assert claim_provenance(settings) == {"key": key, "numeric_env_vars": ["MYLIB_*"]}
    local, _ = env_capture.job_key({"REPRO_DATA_DIR": str(tmp_path / "data")})
    assert local.decode() == key
    file = tmp_path / "data" / env_capture.KEY_FILE
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert provenance_key(Settings(data_dir=tmp_path / "x", provenance_key="set")) == "set"


def test_a_claimed_job_gets_the_key_and_the_merged_numerics_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(env_capture.NUMERIC_ENV, "NODE_FLAG")
    env = env_capture.claim_environment({"key": "abc", "numeric_env_vars": ["MYLIB_*"]})
    assert env == {env_capture.KEY_ENV: "abc", env_capture.NUMERIC_ENV: "MYLIB_*,NODE_FLAG"}
    monkeypatch.delenv(env_capture.NUMERIC_ENV)
    assert env_capture.claim_environment({}) == {}


def test_a_bad_numerics_list_on_a_node_shows_as_a_probe_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(env_capture.NUMERIC_ENV, "NOT A NAME!")
    env = env_capture.claim_environment({"key": "abc"})
    monkeypatch.setenv(env_capture.NUMERIC_ENV, env[env_capture.NUMERIC_ENV])
    monkeypatch.setenv(env_capture.KEY_ENV, "abc")
    record = capture_provenance(spec_hash="h", seed=(1, 2), determinism={})
    assert "NAME!" in record["probe_errors"]["environment"]
    assert record["environment"] == {} and record["environment_digests"]["variables"] == {}


def _env_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any, bool]]:
    return [
        (d["field"], d["a"], d["b"], d["breaks_reproducibility"])
        for d in diff_provenance(a, b)
        if d["field"].startswith("environment")
    ]


def test_the_diff_names_an_unlisted_variable_without_its_value() -> None:
    base = {"HOME": "/root", "TF_DETERMINISTIC_OPS": "1"}
    unset = _capture(base)
    one = _capture({**base, "MYLIB_FAST_MATH": FAST_MATH})
    other = _capture({**base, "MYLIB_FAST_MATH": FAST_MATH + "x"})
    [(field, a, b, breaking)] = _env_diff(unset, one)
    assert field == "environment.MYLIB_FAST_MATH" and a is None and not breaking
    assert b.startswith("hidden:") and b.removeprefix("hidden:") in str(one)
    [(field, a, b, _)] = _env_diff(one, other)
    assert field == "environment.MYLIB_FAST_MATH" and a != b
    assert a.startswith("hidden:") and b.startswith("hidden:")
    assert _env_diff(one, _capture({**base, "MYLIB_FAST_MATH": FAST_MATH})) == []
    for entries in (diff_provenance(unset, one), diff_provenance(one, other)):
        assert FAST_MATH not in json.dumps(entries)
        sentence = _environment_sentence(entries, "compute")
        assert "MYLIB_FAST_MATH" in sentence and FAST_MATH not in sentence
        assert "No recorded environment field that affects numerics differs" not in sentence


def test_listed_variables_show_both_values_and_break_reproducibility() -> None:
    a = _capture({"TF_NUM_INTEROP_THREADS": "1", "TF_CLI_CONFIG_FILE": "/a"})
    b = _capture({"TF_NUM_INTEROP_THREADS": "2", "TF_CLI_CONFIG_FILE": "/b"})
    diff = _env_diff(a, b)
    assert diff[0] == ("environment.TF_NUM_INTEROP_THREADS", "1", "2", True)
    assert diff[1][0] == "environment.TF_CLI_CONFIG_FILE" and diff[1][3] is False


def test_service_settings_no_longer_count_as_changing_results() -> None:
    a = _capture({"REPRO_LEASE_SECONDS": "30"})
    b = _capture({"REPRO_LEASE_SECONDS": "6"})
    [entry] = diff_provenance(a, b)
    assert entry["field"] == "environment.REPRO_LEASE_SECONDS"
    assert entry["breaks_reproducibility"] is False and "Reprotrain setting" in entry["why"]
    sentence = _environment_sentence([entry], "compute")
    assert sentence.startswith("No recorded environment field that affects numerics differs")


def test_old_records_with_values_still_compare_and_render() -> None:
    old_a = {"environment": {"REPRO_LEASE_SECONDS": "30", "TF_DETERMINISTIC_OPS": "1"}}
    old_b = {"environment": {"REPRO_LEASE_SECONDS": "6", "TF_DETERMINISTIC_OPS": "0"}}
    assert _env_diff(old_a, old_b) == [
        ("environment.TF_DETERMINISTIC_OPS", "1", "0", True),
        ("environment.REPRO_LEASE_SECONDS", "30", "6", False),
    ]
    new = _capture({"REPRO_LEASE_SECONDS": "30", "TF_DETERMINISTIC_OPS": "1"})
    [(field, a, b, breaking)] = _env_diff(old_a, new)
    assert (field, a, breaking) == ("environment.REPRO_LEASE_SECONDS", "30", False)
    assert b.startswith("hidden:")


def test_digests_under_different_keys_compare_only_whether_each_is_set() -> None:
    a = _capture({"SAME": "1", "ONLY_A": "x"}, key=b"one")
    b = _capture({"SAME": "2"}, key=b"two")
    diff = _env_diff(a, b)
    assert [d[0] for d in diff] == ["environment.ONLY_A", "environment_digests.key_id"]
    assert diff[0][2] is None and not any(d[3] for d in diff)


def test_a_captured_provenance_holds_no_unlisted_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MYLIB_FAST_MATH", FAST_MATH)
    monkeypatch.setenv("MYLIB_API_TOKEN", SECRET)
    monkeypatch.setenv(env_capture.KEY_ENV, "handed-key-value")
    record = capture_provenance(spec_hash="h", seed=(1, 2), determinism={})
    text = json.dumps(record)
    assert FAST_MATH not in text and SECRET not in text and "handed-key-value" not in text
    hidden = record["environment_digests"]
    assert {"MYLIB_FAST_MATH", "MYLIB_API_TOKEN"} <= set(hidden["variables"])
    assert hidden["key_source"] == "handed"
    assert hidden["key_id"] == env_capture.key_id(b"handed-key-value")
    assert "MYLIB_FAST_MATH" not in relevant_environment()
