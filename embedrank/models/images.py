"""Images read safely: every source (a PIL image, bytes, a path, a ``data:`` URL) checked against
:class:`ImageLimits` before its pixels are decoded.

What a hostile image can cost is bounded here, before any model sees it: the encoded bytes (a data URL's
length is checked before it is base64-decoded), the format (read from the file's magic bytes, never from a
name or a declared media type), and the pixel count the header claims (a 50 KB PNG that claims
100,000 × 100,000 pixels is refused without decompressing anything). An animation gives its first frame;
EXIF orientation is applied, as a camera's viewer shows the photo. Remote URLs are never fetched here.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import re
import warnings
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from embedrank.errors import InvalidInputError, RequestTooLargeError, UnsupportedMediaError

# Pillow's format names of what is decoded, and their media types (a data URL's declared type must be one)
FORMATS: dict[str, str] = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


def format_of(data: bytes) -> str | None:
    """The format the magic bytes of ``data`` announce, among :data:`FORMATS` (None: none of them).

    >>> format_of(b"\\x89PNG\\r\\n\\x1a\\n..."), format_of(b"GIF89a..."), format_of(b"BM...")
    ('PNG', 'GIF', None)
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,", re.I)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageLimits:
    """What one image may cost: encoded bytes, pixels the header claims (width × height), the formats
    decoded (Pillow names, :data:`FORMATS`'s keys). ``param`` names the request field in errors."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    formats: tuple[str, ...] = tuple(FORMATS)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.formats) - set(FORMATS))
        if unknown:
            raise InvalidInputError(f"image formats {unknown} are not decoded; choose among {sorted(FORMATS)}")


DEFAULT_IMAGE_LIMITS = ImageLimits()


def is_data_url(value: str) -> bool:
    """Whether ``value`` is a ``data:`` URL (the way a client sends an image inside a JSON string).

    >>> is_data_url("data:image/png;base64,iVBORw0KGgo="), is_data_url("a photo of a cat")
    (True, False)
    """
    return value[:5].lower() == "data:"


def is_remote_url(value: str) -> bool:
    """Whether ``value`` is an ``http(s)://`` URL.

    >>> is_remote_url("https://example.com/cat.png"), is_remote_url("data:image/png;base64,")
    (True, False)
    """
    return value[:7].lower() == "http://" or value[:8].lower() == "https://"


def data_url_bytes(
    url: str, limits: ImageLimits = DEFAULT_IMAGE_LIMITS, *, param: str | None = None, name: str | None = None
) -> bytes:
    """The bytes of a base64 ``data:`` URL, its length checked against ``limits.max_bytes`` before decoding.
    Errors name the image ``name`` (default: ``param``, else "image") and carry ``param``, the request field.

    >>> data_url_bytes("data:image/png;base64,aGVsbG8=")
    b'hello'

    Raises:
        InvalidInputError: not a base64 data URL, or invalid base64.
        UnsupportedMediaError: a declared media type that is not an image format decoded here.
        RequestTooLargeError: over ``limits.max_bytes``.
    """
    name = name or param or "image"
    head = _DATA_URL.match(url)
    if head is None or not head.group("b64"):
        raise InvalidInputError(f"{name} must be a base64 data URL such as data:image/png;base64,<data>", param=param)
    declared = (head.group("type") or "").lower()
    if declared and declared not in FORMATS.values():
        raise UnsupportedMediaError(
            f"{name} is declared {declared!r}; images are accepted as {sorted(FORMATS.values())}", param=param
        )
    payload = url[head.end() :]
    if len(payload) * 3 // 4 > limits.max_bytes:  # base64 is 4 characters per 3 bytes: no decoding needed
        raise too_many_bytes(len(payload) * 3 // 4, limits.max_bytes, name=name, param=param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError(f"{name} is not valid base64: {exc}", param=param) from None


def too_many_bytes(
    size: int, max_bytes: int, *, name: str = "image", param: str | None = None, at_least: bool = False
) -> RequestTooLargeError:
    """The error of an image of ``size`` bytes (``at_least``: as far as it was read) over ``max_bytes``.

    >>> str(too_many_bytes(2_000, 1_000, name="input[1]"))
    'input[1] is 2,000 bytes, over the limit of 1,000 bytes per image'
    """
    size_text = f"at least {size:,}" if at_least else f"{size:,}"
    return RequestTooLargeError(
        f"{name} is {size_text} bytes, over the limit of {max_bytes:,} bytes per image",
        param=param,
        limit="max_image_bytes",
    )


def open_image(
    data: bytes, limits: ImageLimits = DEFAULT_IMAGE_LIMITS, *, param: str | None = None, name: str | None = None
) -> Image.Image:
    """Encoded image bytes decoded to an RGB image, after the checks of :class:`ImageLimits`: bytes, format
    (by its magic bytes), the header's pixel count; the first frame of an animation; EXIF orientation applied.
    Errors name the image ``name`` (default: ``param``, else "image") and carry ``param``, the request field.

    Raises:
        RequestTooLargeError: over ``limits.max_bytes`` or ``limits.max_pixels`` (nothing decompressed).
        UnsupportedMediaError: not one of ``limits.formats``.
        InvalidInputError: the file is truncated or corrupt.
    """
    name = name or param or "image"
    if len(data) > limits.max_bytes:
        raise too_many_bytes(len(data), limits.max_bytes, name=name, param=param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own pixel limit decides
        try:
            image = Image.open(io.BytesIO(data), formats=list(limits.formats))  # reads the header only
        except Image.DecompressionBombError as exc:  # Pillow's own ceiling, far above any sensible max_pixels
            claimed = re.search(r"\((\d+) pixels\)", str(exc))
            size = f"{int(claimed.group(1)):,} pixels" if claimed else "more pixels than Pillow decodes"
            raise RequestTooLargeError(
                f"{name} claims {size}, over the limit of {limits.max_pixels:,} pixels per image",
                param=param,
                limit="max_image_pixels",
            ) from None
        except Image.UnidentifiedImageError:
            announced = format_of(data)
            if announced in limits.formats:  # the right magic bytes, and nothing readable after them
                raise InvalidInputError(f"{name} is a truncated or corrupt {announced} file", param=param) from None
            raise UnsupportedMediaError(
                f"{name} is not an image in an accepted format ({', '.join(limits.formats)})", param=param
            ) from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise InvalidInputError(f"{name} could not be read: {exc}", param=param) from None
        width, height = image.size
        if width * height > limits.max_pixels:
            raise RequestTooLargeError(
                f"{name} is {width:,} x {height:,} pixels, over the limit of {limits.max_pixels:,} pixels per image",
                param=param,
                limit="max_image_pixels",
            )
        if width < 1 or height < 1:
            raise InvalidInputError(f"{name} has no pixels ({width} x {height})", param=param)
        try:
            image.seek(0)  # an animation's first frame
            image.load()
            return ImageOps.exif_transpose(image).convert("RGB")
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
            raise InvalidInputError(f"{name} could not be decoded: {exc}", param=param) from None


def read_image(
    source: Any, limits: ImageLimits = DEFAULT_IMAGE_LIMITS, *, param: str | None = None, name: str | None = None
) -> Image.Image:
    """One image from any source the library takes: a PIL image (used as given, converted to RGB), encoded
    bytes, a ``data:`` URL, or a path to a file; each checked by :func:`open_image`. An ``http(s)`` URL is
    refused: fetch it yourself (the service fetches only from configured hosts). Errors name the image ``name``
    (default: ``param``, else "image") and carry ``param``, the request field.

    Raises:
        InvalidInputError, UnsupportedMediaError, RequestTooLargeError: as :func:`open_image`; a path that
            is not a file; a remote URL.
    """
    name = name or param or "image"
    if isinstance(source, Image.Image):
        if source.width * source.height > limits.max_pixels:
            raise RequestTooLargeError(
                f"{name} is {source.width:,} x {source.height:,} pixels, over the limit of {limits.max_pixels:,}",
                param=param,
                limit="max_image_pixels",
            )
        return source if source.mode == "RGB" else source.convert("RGB")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return open_image(bytes(source), limits, param=param, name=name)
    if isinstance(source, str) and is_data_url(source):
        return open_image(data_url_bytes(source, limits, param=param, name=name), limits, param=param, name=name)
    if isinstance(source, str) and is_remote_url(source):
        raise InvalidInputError(
            f"{name} is a remote URL; remote images are not fetched here: pass the image's bytes", param=param
        )
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InvalidInputError(f"{name}: no image file at {str(path)!r}", param=param)
        if path.stat().st_size > limits.max_bytes:
            raise too_many_bytes(path.stat().st_size, limits.max_bytes, name=name, param=param)
        return open_image(path.read_bytes(), limits, param=param, name=name)
    raise InvalidInputError(
        f"{name} must be a PIL image, bytes, a data URL or a path, got {type(source).__name__}", param=param
    )
