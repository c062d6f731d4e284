"""The webhook signature: Stripe's scheme, verified as a receiver would, and refused when anything is off."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from alerts.signing import SECRET_PREFIX, SignatureError, new_secret, signature_header, verify

BODY = b'{"id":"evt_1","type":"alert.budget_80"}'


def test_a_signature_verifies_with_the_endpoints_secret_and_not_with_another() -> None:
    secret = new_secret()
    assert secret.startswith(SECRET_PREFIX) and new_secret() != secret
    header = signature_header(secret, timestamp=1_700_000_000, body=BODY)
    assert verify(header, body=BODY, secret=secret, now=1_700_000_010) == 1_700_000_000
    with pytest.raises(SignatureError, match="no v1 signature matches"):
        verify(header, body=BODY, secret=new_secret(), now=1_700_000_010)


def test_the_header_is_stripes_hmac_of_timestamp_dot_body() -> None:
    # What a receiver that never saw our code computes: HMAC-SHA256(secret, "<t>.<body>") in hex.
    expected = hmac.new(b"whsec_test", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert signature_header("whsec_test", timestamp=1_700_000_000, body=BODY) == f"t=1700000000,v1={expected}"


def test_a_changed_body_a_stale_timestamp_or_a_broken_header_is_refused() -> None:
    secret = new_secret()
    header = signature_header(secret, timestamp=1_700_000_000, body=BODY)
    verify(header, body=BODY, secret=secret, now=1_700_000_299)  # inside the 5 minutes
    with pytest.raises(SignatureError):
        verify(header, body=BODY.replace(b"80", b"99"), secret=secret, now=1_700_000_000)
    with pytest.raises(SignatureError, match="tolerance"):
        verify(header, body=BODY, secret=secret, now=1_700_000_301)
    for broken in ("", "v1=abc", "t=soon,v1=abc"):
        with pytest.raises(SignatureError):
            verify(broken, body=BODY, secret=secret, now=1_700_000_000)
