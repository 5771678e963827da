"""The memory of recently verified tokens: what it forgets, and when."""

from __future__ import annotations

from datetime import timedelta

from service.auth import tokens as auth
from service.auth.token_cache import TokenCache
from service.auth.tokens import Principal
from service.persistence.models import utcnow

TOKEN = "rpt_7_" + "s" * 43


def _principal(**fields: object) -> Principal:
    return Principal(token_id=7, name="reader", role="viewer", **fields)  # type: ignore[arg-type]


def test_a_remembered_token_answers_with_its_principal_and_no_other_does() -> None:
    cache = TokenCache(60)
    cache.put(TOKEN, _principal(), generation=auth.revocation_generation())
    assert cache.get(TOKEN) == _principal()
    assert cache.get(TOKEN + "x") is None


def test_a_revocation_forgets_tokens_verified_before_it() -> None:
    cache = TokenCache(60)
    before = auth.revocation_generation()
    cache.put(TOKEN, _principal(), generation=before)
    auth._revocations[0] += 1  # what auth.revoke does once its commit is in
    assert cache.get(TOKEN) is None
    # A check that read the row before the revocation committed is not remembered either.
    cache.put(TOKEN, _principal(), generation=before)
    assert cache.get(TOKEN) is None


def test_a_token_expires_to_the_second_even_when_remembered() -> None:
    cache = TokenCache(60)
    expired = _principal(expires_at=utcnow() - timedelta(seconds=1))
    cache.put(TOKEN, expired, generation=auth.revocation_generation())
    assert cache.get(TOKEN) is None


def test_the_lifetime_bounds_how_long_a_token_is_trusted_without_its_row() -> None:
    cache = TokenCache(0.0)
    cache.put(TOKEN, _principal(), generation=auth.revocation_generation())
    assert cache.get(TOKEN) is None
    short = TokenCache(1e-9)
    short.put(TOKEN, _principal(), generation=auth.revocation_generation())
    assert short.get(TOKEN) is None
