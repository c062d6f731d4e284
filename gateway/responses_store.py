"""Stored responses (/v1/responses with store): the table, and reads, writes and deletes per tenant.

A row keeps the response object as it was returned, this request's input items, and the
whole conversation it was generated from (earlier turns' inputs and outputs, then this
input; instructions are not part of it, as at OpenAI). A later request naming the row with
previous_response_id continues that conversation plus this row's output. Every query is
scoped by tenant: another tenant's id is as unknown as an id that never existed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, String, Text, delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from kvgate.db import Base, UTCDateTime, utcnow
from kvgate.errors import InvalidRequestError, NotFoundError


class StoredResponse(Base):
    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    api_key_id: Mapped[str] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    model: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    previous_response_id: Mapped[str | None] = mapped_column(String(64), default=None)
    instructions: Mapped[str | None] = mapped_column(Text, default=None)
    # JSON texts: this request's input items; the conversation rendered (earlier turns, then this
    # input), canonical items; the response object as returned (its output and usage among them).
    input_json: Mapped[str] = mapped_column(Text)
    context_json: Mapped[str] = mapped_column(Text)
    response_json: Mapped[str] = mapped_column(Text)


class PreviousResponseNotFoundError(InvalidRequestError):
    """OpenAI answers an unknown previous_response_id with a 400 and this code."""

    openai_code = "previous_response_not_found"


def response_not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"No response found with id '{response_id}'.")


@dataclass(frozen=True)
class NewResponse:
    id: str
    tenant_id: str
    api_key_id: str
    model: str
    status: str
    previous_response_id: str | None
    instructions: str | None
    input_items: list[dict[str, Any]]
    context: list[dict[str, Any]]
    response: dict[str, Any]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def save(sessions: async_sessionmaker[AsyncSession], new: NewResponse) -> None:
    async with sessions() as session:
        session.add(
            StoredResponse(
                id=new.id,
                tenant_id=new.tenant_id,
                api_key_id=new.api_key_id,
                model=new.model,
                status=new.status,
                previous_response_id=new.previous_response_id,
                instructions=new.instructions,
                input_json=_dumps(new.input_items),
                context_json=_dumps(new.context),
                response_json=_dumps(new.response),
            )
        )
        await session.commit()


async def _get(session: AsyncSession, *, tenant_id: str, response_id: str) -> StoredResponse | None:
    query = select(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.tenant_id == tenant_id)
    return (await session.execute(query)).scalar_one_or_none()


async def response_json(session: AsyncSession, *, tenant_id: str, response_id: str) -> str:
    """The stored response object, as JSON text; 404 if the tenant has no such response."""
    row = await _get(session, tenant_id=tenant_id, response_id=response_id)
    if row is None:
        raise response_not_found(response_id)
    return row.response_json


async def input_items(session: AsyncSession, *, tenant_id: str, response_id: str) -> list[dict[str, Any]]:
    """This request's own input items (canonical); 404 if the tenant has no such response."""
    row = await _get(session, tenant_id=tenant_id, response_id=response_id)
    if row is None:
        raise response_not_found(response_id)
    return json.loads(row.input_json)


async def remove(session: AsyncSession, *, tenant_id: str, response_id: str) -> None:
    """Delete a stored response; 404 if the tenant has no such response."""
    query = delete(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.tenant_id == tenant_id)
    result = await session.execute(query)
    await session.commit()
    if not result.rowcount:  # type: ignore[attr-defined]
        raise response_not_found(response_id)


async def conversation_after(
    sessions: async_sessionmaker[AsyncSession], *, tenant_id: str, response_id: str
) -> tuple[dict[str, Any], ...]:
    """The conversation a request continuing `response_id` builds on: its context, then its output.

    400 (previous_response_not_found) if the tenant has no such stored response.
    """
    async with sessions() as session:
        row = await _get(session, tenant_id=tenant_id, response_id=response_id)
    if row is None:
        raise PreviousResponseNotFoundError(
            f"Previous response with id '{response_id}' not found.", param="previous_response_id"
        )
    output = [_as_input(item) for item in json.loads(row.response_json)["output"]]
    return (*json.loads(row.context_json), *output)


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    """An output item in its canonical input form (the ids and statuses are the response's own)."""
    if item["type"] == "message":
        content = [{"type": "output_text", "text": part["text"]} for part in item["content"]]
        return {"type": "message", "role": "assistant", "content": content}
    return {"type": item["type"], "call_id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
