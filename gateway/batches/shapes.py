"""What each API says about a batch: Anthropic's MessageBatch and OpenAI's Batch and file objects, and the
result lines (Anthropic's results JSONL, OpenAI's output and error files)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gateway.api.errors import anthropic_body, openai_body
from gateway.batches.models import CANCELED, CANCELING, ENDED, ERRORED, EXPIRED, SUCCEEDED, Batch, BatchFile
from kvgate.errors import KvgateError

COUNTED = ("processing", SUCCEEDED, ERRORED, CANCELED, EXPIRED)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def _epoch(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def message_batch(batch: Batch, counts: Mapping[str, int], *, results_url: str) -> dict[str, Any]:
    """Anthropic's MessageBatch (anthropic.types.messages.MessageBatch)."""
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": batch.status,
        "request_counts": {
            "processing": counts.get("processing", 0),
            "succeeded": counts.get(SUCCEEDED, 0),
            "errored": counts.get(ERRORED, 0),
            "canceled": counts.get(CANCELED, 0),
            "expired": counts.get(EXPIRED, 0),
        },
        "created_at": _iso(batch.created_at),
        "expires_at": _iso(batch.expires_at),
        "cancel_initiated_at": _iso(batch.cancel_requested_at),
        "ended_at": _iso(batch.ended_at),
        "archived_at": None,
        "results_url": results_url if batch.status == ENDED else None,
    }


def openai_status(batch: Batch, counts: Mapping[str, int]) -> str:
    if batch.status == ENDED:
        if batch.cancel_requested_at is not None:
            return "cancelled"
        if counts.get(EXPIRED, 0) and not counts.get(SUCCEEDED, 0) and not counts.get(ERRORED, 0):
            return "expired"
        return "completed"
    return "cancelling" if batch.status == CANCELING else "in_progress"


def openai_batch(
    batch: Batch, counts: Mapping[str, int], *, output_file_id: str | None, error_file_id: str | None
) -> dict[str, Any]:
    """OpenAI's Batch (openai.types.Batch)."""
    status = openai_status(batch, counts)
    ended = _epoch(batch.ended_at)
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": status,
        "output_file_id": output_file_id,
        "error_file_id": error_file_id,
        "created_at": _epoch(batch.created_at),
        "in_progress_at": _epoch(batch.created_at),
        "expires_at": _epoch(batch.expires_at),
        "finalizing_at": ended,
        "completed_at": ended if status == "completed" else None,
        "failed_at": None,
        "expired_at": ended if status == "expired" else None,
        "cancelling_at": _epoch(batch.cancel_requested_at),
        "cancelled_at": ended if status == "cancelled" else None,
        "request_counts": {
            "total": batch.request_count,
            "completed": counts.get(SUCCEEDED, 0),
            "failed": counts.get(ERRORED, 0) + counts.get(CANCELED, 0) + counts.get(EXPIRED, 0),
        },
        "metadata": json.loads(batch.metadata_json) if batch.metadata_json else None,
    }


def file_object(row: BatchFile, *, size: int | None = None) -> dict[str, Any]:
    """OpenAI's FileObject (openai.types.FileObject)."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.size if size is None else size,
        "created_at": _epoch(row.created_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


# -- results -------------------------------------------------------------------------------------------


def anthropic_errored(error: KvgateError, request_id: str) -> dict[str, Any]:
    return {"type": ERRORED, "error": anthropic_body(error, request_id)}


def anthropic_ended(kind: str) -> dict[str, Any]:
    """A canceled or expired item's result."""
    return {"type": kind}


def openai_response(status_code: int, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"response": {"status_code": status_code, "request_id": request_id, "body": body}, "error": None}


def openai_errored(error: KvgateError, request_id: str) -> dict[str, Any]:
    return openai_response(error.openai_status or error.status, request_id, openai_body(error))


OPENAI_ENDED = {
    CANCELED: ("batch_cancelled", "This request was not run: the batch was cancelled."),
    EXPIRED: ("batch_expired", "This request could not be executed before the completion window expired."),
}


def openai_ended(kind: str) -> dict[str, Any]:
    code, message = OPENAI_ENDED[kind]
    return {"response": None, "error": {"code": code, "message": message}}


def ended_result(api: str, kind: str) -> dict[str, Any]:
    return anthropic_ended(kind) if api == "anthropic" else openai_ended(kind)


def errored_result(api: str, error: KvgateError, request_id: str) -> dict[str, Any]:
    return anthropic_errored(error, request_id) if api == "anthropic" else openai_errored(error, request_id)


def result_line(api: str, *, batch_id: str, position: int, custom_id: str, result_json: str) -> str:
    """One JSONL line: Anthropic's {custom_id, result}, OpenAI's {id, custom_id, response, error}."""
    if api == "anthropic":
        return f'{{"custom_id":{json.dumps(custom_id)},"result":{result_json}}}\n'
    line_id = json.dumps(f"batch_req_{batch_id.removeprefix('batch_')}_{position}")
    return f'{{"id":{line_id},"custom_id":{json.dumps(custom_id)},{result_json[1:]}\n'
