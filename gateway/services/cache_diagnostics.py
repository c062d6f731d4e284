"""Cache diagnostics for one request: its fingerprint kept under its response id, and the comparison it asked for.

The prepare job (inline or in a worker) calls `fingerprint_job` with the chat and its rendered
prompt: plain digests always (cheap: one SHA-256 pass over the sections), and the sections' token
starts only when the request names a response to compare with. On the event loop, `diagnose`
seals the digests with the tenant's key, looks the named response up in the tenant's store (an id
of another tenant is simply not there), compares, and keeps this request's fingerprint under its
own response id, for every response, so that any response can be a later baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.cache_diagnosis import Comparison, compare
from gateway.cache_fingerprints import Fingerprint, PromptDigests, digests_of, seal, tenant_key
from gateway.prompt import Chat, PromptRenderer, RenderedPrompt
from gateway.prompt_sections import SectionStarts, section_starts

if TYPE_CHECKING:
    from gateway.state import Gateway


@dataclass(frozen=True)
class FingerprintJob:
    """What the prepare job hands the event loop (picklable)."""

    digests: PromptDigests
    compare_to: str | None  # the response id the request asked to be compared with
    starts: SectionStarts | None  # set when compare_to is


def fingerprint_job(
    renderer: PromptRenderer,
    chat: Chat,
    prompt: RenderedPrompt,
    *,
    model: str,
    client_salt: str | None,
    compare_to: str | None,
) -> FingerprintJob:
    digests = digests_of(chat, model=model, client_salt=client_salt, prompt_tokens=len(prompt.token_ids))
    starts = section_starts(renderer, chat, prompt) if compare_to is not None else None
    return FingerprintJob(digests, compare_to, starts)


@dataclass(frozen=True)
class Diagnosis:
    comparison: Comparison | None  # None: the request asked for none
    fingerprint: Fingerprint  # this request's, sealed (for its cache explanation: gateway.cache_probe)


def sealed(gw: Gateway, *, tenant_id: str, job: FingerprintJob) -> Fingerprint:
    return seal(job.digests, tenant_key(gw.secret, tenant_id))


async def diagnose(gw: Gateway, *, tenant_id: str, response_id: str, job: FingerprintJob) -> Diagnosis:
    """The comparison the request asked for, and its sealed fingerprint, kept under its response id."""
    current = sealed(gw, tenant_id=tenant_id, job=job)
    comparison = None
    if job.compare_to is not None:
        earlier = await gw.fingerprints.get(tenant_id, job.compare_to)
        if earlier is None:
            comparison = Comparison(found=False)
        else:
            assert job.starts is not None  # fingerprint_job takes them whenever compare_to is set
            comparison = Comparison(found=True, divergence=compare(earlier, current, job.starts))
    await gw.fingerprints.put(tenant_id, response_id, current)
    return Diagnosis(comparison, current)
