"""One address presenting a new token id with every guess still meets the failed-auth limit,
and a valid token from that address still works."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.integration.service_procs import Service

PER_ADDRESS = 30


def test_guessing_many_token_ids_from_one_address_gets_429_and_valid_tokens_pass(
    tmp_path: Path,
) -> None:
    service = Service(
        tmp_path / "data",
        extra=("--no-demo",),
        env={
            "REPRO_AUTH_FAILURES_ALLOWED": "5",
            "REPRO_AUTH_FAILURES_PER_ADDRESS": str(PER_ADDRESS),
        },
    )
    service.wait_ready()
    try:
        viewer = service.token("viewer", "reader")
        with httpx.Client(base_url=service.url, timeout=30) as c:
            # Each guess claims another token id: the per-identity count never passes 1.
            answers = [
                c.get("/api/v1/runs", headers={"Authorization": f"Bearer rpt_{n}_" + "z" * 43})
                for n in range(1000, 1000 + PER_ADDRESS + 5)
            ]
            codes = [a.status_code for a in answers]
            assert codes == [401] * PER_ADDRESS + [429] * 5, codes
            limited = answers[-1]
            assert "too many invalid tokens" in limited.text
            assert 1 <= int(limited.headers["Retry-After"]) <= 61
            # Valid tokens from the same address are verified first and never refused.
            for token in (service.admin_token, viewer):
                ok = c.get("/api/v1/runs", headers={"Authorization": f"Bearer {token}"})
                assert ok.status_code == 200, ok.text
            assert c.get("/healthz").status_code == 200
            # A bad token still gets 429 from this address, whatever id it names.
            again = c.get("/api/v1/runs", headers={"Authorization": "Bearer rpt_77777_" + "q" * 43})
            assert again.status_code == 429
    finally:
        service.stop()
