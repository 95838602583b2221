"""OpenAI's file objects as the service sends them (msgspec), and a file's row as one."""

from __future__ import annotations

from typing import Literal

import msgspec

from service.files.store import FileRow


class FileObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def file_object(row: FileRow) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        filename=row.filename,
        purpose=row.purpose,
        expires_at=row.expires_at,
    )
