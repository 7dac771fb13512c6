"""``POST /api/v1/assistant/files``: upload a CSV as a dataset of the caller's.

The upload is read with a size limit, checked as CSV (``api.assistant.models.check_csv``),
sealed with a fresh data key for the dataset and recorded on ``voice.datasets``; its position
on the log is what a chat turn later hands to the worker.
"""

from __future__ import annotations

import asyncio
import email.policy
import re
import uuid
from datetime import UTC, datetime
from email.parser import BytesParser
from pathlib import PurePosixPath

from fastapi import APIRouter, HTTPException, Request

from api.assistant.deps import AssistantDep
from api.assistant.models import CsvRejected, DatasetUploaded, check_csv
from api.frame.body import BodyLimit
from api.frame.commands import CommandsDep
from api.frame.deps import ConverseDep, SealerDep
from api.frame.quotas import TOO_MANY, quota
from schemas.assistant import DatasetRecorded
from streams.assistant_settings import AssistantSettings
from streams.topics import DATASETS

router = APIRouter(prefix="/api/v1/assistant", tags=["assistant"])

UPLOAD_OVERHEAD = 64 * 1024
"""Bytes of multipart framing and form fields accepted beyond the file's own limit."""


UPLOAD_PATH = f"{router.prefix}/files"


def upload_body_limit(settings: AssistantSettings) -> BodyLimit:
    """The body limit of the upload route: the file's limit plus the multipart framing. The
    edge's ``BodyGuard`` enforces it before the route runs; ``_read_body`` again, for an app
    mounted without the guard."""
    return BodyLimit(settings.max_upload_bytes + UPLOAD_OVERHEAD,
                     f"VOICE_MAX_UPLOAD_BYTES ({settings.max_upload_bytes}) plus {UPLOAD_OVERHEAD} "
                     "bytes of form framing")


async def _read_body(request: Request, limit: BodyLimit) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit.max_bytes:
        raise HTTPException(413, limit.detail)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit.max_bytes:
            raise HTTPException(413, limit.detail)
        chunks.append(chunk)
    return b"".join(chunks)


def _file_part(content_type: str, body: bytes) -> tuple[str | None, bytes, dict[str, str]]:
    """(file name, bytes of the part named ``file``, other form fields)."""
    msg = BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not msg.is_multipart():
        raise HTTPException(422, "the body is not multipart/form-data")
    found: tuple[str | None, bytes] | None = None
    fields: dict[str, str] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file" and found is None:
            found = (part.get_filename(), payload)
        elif isinstance(name, str):
            fields[name] = payload.decode("utf-8", "replace")
    if found is None:
        raise HTTPException(422, "no form part named 'file' (send the CSV as file=@data.csv)")
    return found[0], found[1], fields


def _dataset_name(filename: str | None, given: str | None) -> str:
    raw = (given or "").strip() or PurePosixPath((filename or "").replace("\\", "/")).name
    return re.sub(r"[\x00-\x1f]", "", raw)[:200] or "dataset.csv"


@router.post("/files", status_code=201, dependencies=[quota("uploads")], responses={
    **TOO_MANY,
    413: {"description": "Larger than VOICE_MAX_UPLOAD_BYTES."},
    415: {"description": "Not multipart/form-data."},
    422: {"description": "Not a CSV with a header and at least one row (the detail says why)."},
    503: {"description": "The dataset could not be recorded; try again."}},
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "string", "format": "binary"},
            "name": {"type": "string", "description": "Overrides the file's name."}}}}}}})
async def upload_file(request: Request, commands: CommandsDep, views: AssistantDep,
                      sealer: SealerDep, principal: ConverseDep) -> DatasetUploaded:
    """Upload a CSV (form part ``file``); use its ``dataset_id`` in ``data_refs``."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise HTTPException(415, "send the CSV as multipart/form-data, in a part named 'file'")
    limit = views.settings.max_upload_bytes
    body = await _read_body(request, upload_body_limit(views.settings))
    filename, data, fields = _file_part(content_type, body)
    if len(data) > limit:
        raise HTTPException(413, f"the file is {len(data)} bytes; the limit is {limit} bytes "
                                 "(VOICE_MAX_UPLOAD_BYTES)")
    try:
        checked = check_csv(data)
    except CsvRejected as exc:
        raise HTTPException(422, f"not a usable CSV: {exc}") from None
    name = _dataset_name(filename, fields.get("name"))
    dataset_id = uuid.uuid4().hex
    await asyncio.to_thread(sealer.create, dataset_id, principal.tenant)
    record = DatasetRecorded(
        dataset_id=dataset_id, owner=principal.sub, rows=checked.rows,
        columns=len(checked.columns), size_bytes=len(data),
        meta=sealer.seal_json(dataset_id, "meta", {"name": name, "columns": checked.columns}),
        csv=sealer.seal(dataset_id, "csv", checked.text), at=datetime.now(UTC).isoformat())
    env = commands.envelope(record, dataset_id, id=dataset_id)
    msg = await commands.record(DATASETS, env, "record the dataset")
    views.datasets.apply(env, msg.partition(), msg.offset())  # read-your-writes on this edge
    return DatasetUploaded(dataset_id=dataset_id, name=name, rows=checked.rows,
                           columns=checked.columns)
