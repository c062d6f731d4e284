"""OpenAI Files, as the Batch API uses them: POST /v1/files (purpose "batch"), GET /v1/files/{id},
GET /v1/files/{id}/content, GET /v1/files, DELETE /v1/files/{id}. Output and error files are made from
their batch's results when read."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from starlette.datastructures import UploadFile
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.api.deps import ContextDep, GatewayDep
from gateway.batches import store
from gateway.batches.models import ERRORS, OUTPUT, Batch, BatchFile
from gateway.batches.shapes import file_object
from gateway.generation import admit_rate
from gateway.state import Gateway
from kvgate.db import utcnow
from kvgate.errors import InvalidRequestError

router = APIRouter(prefix="/v1/files", tags=["openai"])

PURPOSES = ("batch",)


async def _output_size(gw: Gateway, row: BatchFile) -> int:
    return sum([len(chunk) async for chunk in _output_content(gw, row)])


async def _output_content(gw: Gateway, row: BatchFile) -> AsyncIterator[bytes]:
    async with gw.sessions() as session:
        batch = await session.get(Batch, row.batch_id)
    if batch is None:
        return
    async for line in store.result_lines(gw.sessions, batch, only=OUTPUT if row.kind == OUTPUT else ERRORS):
        yield line.encode()


async def _shaped(gw: Gateway, row: BatchFile) -> dict[str, object]:
    return file_object(row, size=await _output_size(gw, row) if row.content is None else None)


def _filename(name: str | None) -> str:
    """The upload's name as text any database stores (no NUL, no lone surrogate), at most 256 characters."""
    text = (name or "upload.jsonl").replace("\x00", "")
    return text.encode("utf-8", errors="replace").decode("utf-8")[:256] or "upload.jsonl"


@router.post("")
async def create_file(request: Request, gw: GatewayDep, ctx: ContextDep) -> Response:
    rate = await admit_rate(gw, ctx=ctx, counts_input_tokens=False)
    try:
        form = await request.form(max_files=1, max_fields=8, max_part_size=gw.settings.max_request_bytes)
    except Exception as exc:  # malformed multipart
        raise InvalidRequestError(f"the body must be multipart/form-data with file and purpose ({exc})") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if purpose not in PURPOSES:
        raise InvalidRequestError(f"purpose: {purpose!r} is not supported here; use 'batch'", param="purpose")
    if not isinstance(upload, UploadFile):
        raise InvalidRequestError("file: a file is required", param="file")
    content = await upload.read()
    row = BatchFile(
        id=store.new_id("file-"),
        tenant_id=ctx.principal.tenant_id,
        purpose=str(purpose),
        filename=_filename(upload.filename),
        created_at=utcnow(),
        size=len(content),
        content=content,
        kind="input",
    )
    async with gw.sessions() as session:
        session.add(row)
        await session.commit()
    return JSONResponse(file_object(row), headers=rate.headers)


@router.get("")
async def list_files(
    gw: GatewayDep, ctx: ContextDep, purpose: str | None = None, limit: int = Query(10000, ge=1, le=10000)
) -> Response:
    async with gw.sessions() as session:
        query = select(BatchFile).where(BatchFile.tenant_id == ctx.principal.tenant_id)
        if purpose is not None:
            query = query.where(BatchFile.purpose == purpose)
        rows = (await session.scalars(query.order_by(BatchFile.created_at.desc()).limit(limit))).all()
    data = [await _shaped(gw, row) for row in rows]
    return JSONResponse({"object": "list", "data": data, "has_more": False})


@router.get("/{file_id}")
async def retrieve_file(file_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    async with gw.sessions() as session:
        row = await store.get_file(session, tenant_id=ctx.principal.tenant_id, file_id=file_id)
    return JSONResponse(await _shaped(gw, row))


@router.get("/{file_id}/content")
async def file_content(file_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    async with gw.sessions() as session:
        row = await store.get_file(session, tenant_id=ctx.principal.tenant_id, file_id=file_id)
    if row.content is not None:
        return Response(row.content, media_type="application/octet-stream")
    return StreamingResponse(_output_content(gw, row), media_type="application/octet-stream")


@router.delete("/{file_id}")
async def delete_file(file_id: str, gw: GatewayDep, ctx: ContextDep) -> Response:
    async with gw.sessions() as session:
        row = await store.get_file(session, tenant_id=ctx.principal.tenant_id, file_id=file_id)
        if row.batch_id is not None:
            raise InvalidRequestError(f"file {file_id} is a batch's output; it goes with its batch")
        await session.delete(row)
        await session.commit()
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
