"""``POST /api/v1/assistant/files``: upload a CSV as a dataset of the caller's, or an image.

The upload is read with a size limit, checked (a CSV by ``api.assistant.models.check_csv``;
a part sent as ``image/png`` or ``image/jpeg`` by its signature), sealed with a fresh data key
and recorded on ``voice.datasets``; its position on the log is what a chat turn later hands to
the worker (no shared filesystem).
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
from api.assistant.models import CsvRejected, DatasetUploaded, ImageUploaded, check_csv
from api.frame.body import BodyLimit
from api.frame.commands import CommandsDep
from api.frame.deps import ConverseDep, SealerDep
from api.frame.quotas import TOO_MANY, quota
from schemas.assistant import IMAGE_TYPES, NAMESPACE, DatasetRecorded, ImageRecorded
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


def _file_part(content_type: str, body: bytes
               ) -> tuple[str | None, bytes, dict[str, str], str]:
    """(file name, bytes of the part named ``file``, other form fields, the part's type)."""
    msg = BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not msg.is_multipart():
        raise HTTPException(422, "the body is not multipart/form-data")
    found: tuple[str | None, bytes, str] | None = None
    fields: dict[str, str] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file" and found is None:
            found = (part.get_filename(), payload, part.get_content_type())
        elif isinstance(name, str):
            fields[name] = payload.decode("utf-8", "replace")
    if found is None:
        raise HTTPException(422, "no form part named 'file' (send the CSV as file=@data.csv)")
    return found[0], found[1], fields, found[2]


def _dataset_name(filename: str | None, given: str | None, default: str = "dataset.csv") -> str:
    raw = (given or "").strip() or PurePosixPath((filename or "").replace("\\", "/")).name
    return re.sub(r"[\x00-\x1f]", "", raw)[:200] or default


SIGNATURES = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
"""The first bytes of each accepted image type: a part is taken for what its bytes are."""


async def _record_image(commands: CommandsDep, views: AssistantDep, sealer: SealerDep,
                        principal: ConverseDep, data: bytes, media_type: str, name: str,
                        namespace: str | None) -> ImageUploaded:
    """Check the image's signature, seal it with a fresh key, record it on voice.datasets."""
    if not data.startswith(SIGNATURES[media_type]):
        raise HTTPException(422, f"file: the part says {media_type} but its bytes are not a "
                                 f"{media_type.split('/')[1].upper()} image")
    image_id = uuid.uuid4().hex
    await asyncio.to_thread(sealer.create, image_id, principal.tenant)
    record = ImageRecorded(
        image_id=image_id, owner=principal.sub, media_type=media_type,  # type: ignore[arg-type]
        size_bytes=len(data), meta=sealer.seal_json(image_id, "meta", {"name": name}),
        image=sealer.seal(image_id, "image", data), at=datetime.now(UTC).isoformat(),
        namespace=namespace)
    env = commands.envelope(record, image_id, id=image_id)
    msg = await commands.record(DATASETS, env, "record the image")
    views.datasets.apply(env, msg.partition(), msg.offset())  # read-your-writes on this edge
    return ImageUploaded(image_id=image_id, name=name, media_type=media_type,
                         size_bytes=len(data), namespace=namespace)


def _namespace(given: str | None) -> str | None:
    """The form's ``namespace`` (blank: the default one); 422 naming the field if malformed."""
    value = (given or "").strip()
    if not value:
        return None
    if re.fullmatch(NAMESPACE, value) is None:
        raise HTTPException(422, f"namespace: {value[:80]!r} is not a namespace name (1 to 64 "
                                 "letters, digits, '_', '.' or '-')")
    return value


@router.post("/files", status_code=201, dependencies=[quota("uploads")], responses={
    **TOO_MANY,
    413: {"description": "Larger than VOICE_MAX_UPLOAD_BYTES."},
    415: {"description": "Not multipart/form-data."},
    422: {"description": "Not a CSV with a header and at least one row, or an image part whose "
                         "bytes are not that image type (the detail says why)."},
    503: {"description": "The dataset could not be recorded; try again."}},
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "string", "format": "binary", "description": "A CSV, or a "
                     "PNG or JPEG image sent with its type (image/png, image/jpeg)."},
            "name": {"type": "string", "description": "Overrides the file's name."},
            "namespace": {"type": "string", "pattern": NAMESPACE,
                          "description": "The namespace the dataset belongs to (omitted: "
                                         "the default one)."}}}}}}})
async def upload_file(request: Request, commands: CommandsDep, views: AssistantDep,
                      sealer: SealerDep, principal: ConverseDep
                      ) -> DatasetUploaded | ImageUploaded:
    """Upload a CSV (form part ``file``; use its ``dataset_id`` in ``data_refs``) or a PNG or
    JPEG image (the part's type ``image/png`` or ``image/jpeg``; name its ``image_id`` in
    ``file_context`` as ``ID: <image_id>``)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise HTTPException(415, "send the CSV as multipart/form-data, in a part named 'file'")
    limit = views.settings.max_upload_bytes
    body = await _read_body(request, upload_body_limit(views.settings))
    filename, data, fields, part_type = _file_part(content_type, body)
    if len(data) > limit:
        raise HTTPException(413, f"the file is {len(data)} bytes; the limit is {limit} bytes "
                                 "(VOICE_MAX_UPLOAD_BYTES)")
    if part_type in IMAGE_TYPES:
        return await _record_image(commands, views, sealer, principal, data,
                                   part_type, _dataset_name(filename, fields.get("name"), "image"),
                                   _namespace(fields.get("namespace")))
    try:
        checked = check_csv(data)
    except CsvRejected as exc:
        raise HTTPException(422, f"not a usable CSV: {exc}") from None
    name = _dataset_name(filename, fields.get("name"))
    namespace = _namespace(fields.get("namespace"))
    dataset_id = uuid.uuid4().hex
    await asyncio.to_thread(sealer.create, dataset_id, principal.tenant)
    record = DatasetRecorded(
        dataset_id=dataset_id, owner=principal.sub, rows=checked.rows,
        columns=len(checked.columns), size_bytes=len(data),
        meta=sealer.seal_json(dataset_id, "meta", {"name": name, "columns": checked.columns}),
        csv=sealer.seal(dataset_id, "csv", checked.text), at=datetime.now(UTC).isoformat(),
        namespace=namespace)
    env = commands.envelope(record, dataset_id, id=dataset_id)
    msg = await commands.record(DATASETS, env, "record the dataset")
    views.datasets.apply(env, msg.partition(), msg.offset())  # read-your-writes on this edge
    return DatasetUploaded(dataset_id=dataset_id, name=name, rows=checked.rows,
                           columns=checked.columns, namespace=namespace)
