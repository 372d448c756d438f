"""A request's raw bytes checked, decoded and preprocessed, or refused in one line.

In: the body, its Content-Type and the server's limits. Out: for an image model the decoded
image, for a text model the text (``read_text``: UTF-8, or JSON ``{"text": ...}``); the readers
(``readers``) turn them into a ``Prepared`` (the feeds
of a batch of one, the size class the batcher groups by, and the time decoding and preprocessing
took), or a ``BadInput`` carrying the HTTP status and one line naming the problem: an empty body,
a body over the size limit (413), text or any bytes that are not a PNG or JPEG (415; text that is
not UTF-8 says so), an image whose header claims more pixels than allowed (413: the header is read
and judged before a single pixel is decoded, so a 40000x40000 decompression bomb costs nothing),
a truncated or corrupt image (400).

Runs in the preprocessing worker processes (``pipeline.serve.app``), or in the request handler in
``inline`` mode: the same function either way. Everything it returns or raises is picklable.
"""
from __future__ import annotations

import io
from dataclasses import dataclass


IMAGE_FORMATS = ("PNG", "JPEG")
MAGIC = {"PNG": b"\x89PNG\r\n\x1a\n", "JPEG": b"\xff\xd8\xff"}
# The preprocessed input's default bound, all feeds together: an OCR line 32 tall and 8192 wide
MAX_INPUT_VALUES = 32 * 8192


class BadInput(Exception):
    """A request the server refuses: ``status`` and one line."""

    def __init__(self, status: int, line: str):
        super().__init__(status, line)
        self.status, self.line = status, line

    def __str__(self) -> str:
        return self.line


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_pixels: int
    max_side: int
    max_input_values: int = MAX_INPUT_VALUES

    @classmethod
    def of(cls, cfg) -> "Limits":
        """A server's limits from its ``ServeConfig``."""
        return cls(cfg.max_body_bytes, cfg.max_pixels, cfg.max_side, cfg.max_input_values)


@dataclass
class Prepared:
    feeds: dict          # input name -> array [1, ...]
    size: int            # the task's size axis (a line's width): the batcher's shape class
    decode_ms: float
    preprocess_ms: float
    # a detector's image: (sx, sy, left, top, width, height), the model input's pixels being the
    # image's times s plus the offset; its boxes are mapped back through it (``in_image``)
    geometry: tuple | None = None


def check_body(body: bytes, limits: Limits) -> None:
    if not body:
        raise BadInput(400, "empty body: send the image's bytes (PNG or JPEG)")
    if len(body) > limits.max_body_bytes:
        raise BadInput(413, f"body of {len(body)} bytes is over the limit of "
                            f"{limits.max_body_bytes} bytes (--max-body-bytes)")


def open_image(body: bytes, content_type: str, limits: Limits):
    """The decoded image (PIL), its header judged before its pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    check_body(body, limits)
    kind = content_type.split(";")[0].strip().lower()
    if kind.startswith("text/") or kind == "application/json":
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(400, f"body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset "
                                f"{e.start}); this model reads images (PNG or JPEG)") from None
        raise BadInput(415, f"Content-Type {kind}: this model reads images (PNG or JPEG bytes)")
    # Pillow's own bomb check raises inside open() without the size; ours (below, stricter, and
    # before any pixel is decoded) names it. This process only decodes requests.
    Image.MAX_IMAGE_PIXELS = None
    try:
        image = Image.open(io.BytesIO(body))  # reads the header only
    except UnidentifiedImageError:
        claimed = next((f for f, magic in MAGIC.items() if body.startswith(magic)), None)
        if claimed:  # its signature is right, its header is not (a 0-pixel side, say)
            raise BadInput(400, f"a {claimed} whose header Pillow cannot read (damaged, or "
                                "a side of 0 pixels)") from None
        raise BadInput(415, f"body is not a PNG or JPEG image (it starts with "
                            f"{body[:8].hex()})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise BadInput(400, f"unreadable image header: {str(e) or type(e).__name__}") from None
    if image.format not in IMAGE_FORMATS:
        raise BadInput(415, f"a {image.format} image: send PNG or JPEG")
    w, h = image.size
    if w * h > limits.max_pixels or max(w, h) > limits.max_side:
        raise BadInput(413, f"image header claims {w}x{h} pixels, over the limit of "
                            f"{limits.max_pixels} pixels or {limits.max_side} per side "
                            "(--max-pixels, --max-side); not decoded")
    if w == 0 or h == 0:
        raise BadInput(400, f"image header claims {w}x{h} pixels: an empty image")
    try:
        image.load()
        # turned upright by its EXIF orientation, as the evaluation's images were
        # (pipeline.data.images.open_checked, as datasets decodes them): a phone's JPEG
        if image.getexif().get(Image.ExifTags.Base.Orientation) is not None:
            from PIL import ImageOps

            image = ImageOps.exif_transpose(image)
    except (OSError, SyntaxError, ValueError) as e:  # what Pillow raises for a damaged file
        raise BadInput(400, f"truncated or corrupt {image.format}: "
                            f"{str(e) or type(e).__name__}") from None
    return image


def _not_an_image(body: bytes, content_type: str, limits: Limits, reads: str) -> str:
    """The body within its limits and not declared an image (415 naming what the model
    ``reads``); its Content-Type's media type, lower case."""
    check_body(body, limits)
    kind = content_type.split(";")[0].strip().lower()
    if kind.startswith("image/"):
        raise BadInput(415, f"Content-Type {kind}: this model reads {reads}")
    return kind


def json_body(body: bytes):
    """A request's JSON value: bytes that are not UTF-8, that are not JSON, or JSON nested
    deeper than the parser's recursion (a body of 5,000 brackets: a 500 before) are one 400
    line each. Every route that reads JSON reads it here."""
    import json

    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise BadInput(400, f"body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset "
                            f"{e.start})") from None
    except json.JSONDecodeError as e:
        raise BadInput(400, f"body is not valid JSON ({e.msg} at line {e.lineno} column "
                            f"{e.colno})") from None
    except RecursionError:
        raise BadInput(400, "body is JSON nested too deeply to read") from None


def read_text(body: bytes, content_type: str, limits: Limits) -> str:
    """A text model's request: the body as UTF-8 text, or a JSON object whose ``text`` is a
    string (Content-Type application/json); an image, bytes that are not UTF-8, JSON without a
    string ``text`` or text of only whitespace is one line."""
    kind = _not_an_image(body, content_type, limits, 'text (UTF-8, or JSON {"text": ...})')
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(400, f"body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset "
                            f"{e.start})") from None
    if kind == "application/json":
        value = json_body(body)
        if not isinstance(value, dict) or not isinstance(value.get("text"), str):
            raise BadInput(400, 'JSON body must be an object with a string "text", e.g. '
                                '{"text": "a sentence"}')
        text = value["text"]
    if not text.strip():
        raise BadInput(400, "empty text: send the sentence to read")
    return text


NPY, NPZ = b"\x93NUMPY", b"PK\x03\x04"  # numpy's .npy and .npz (a zip of .npy files)


def json_inputs(body: bytes, content_type: str, limits: Limits, names: list[str],
                image: str | None = None) -> dict:
    """A model of array inputs' request: a JSON object ``{"inputs": {name: value}}`` with one
    sample of every input in ``names`` (no batch axis); or numpy's own files, read in
    microseconds where JSON numbers take tens of milliseconds (a 3x320x320 image: 86 ms): a
    ``.npz`` of one array per input, by name, or a ``.npy`` for a model of one input.
    ``image``: the input sent as an image file (JSON only). Out: the values by name; a body of
    other inputs is one 400 line, an image one 415."""
    reads = ('arrays (JSON {"inputs": {name: [...]}}, or numpy .npz / .npy bytes)'
             if image is None else f'JSON {{"inputs": {{...}}}} with the image {image} in base64')
    _not_an_image(body, content_type, limits, reads)
    if body[:6] == NPY or body[:4] == NPZ:
        if image is not None:
            raise BadInput(415, f"a numpy file: this model reads {reads}")
        given = numpy_inputs(body, limits, names)
        if sorted(given) != sorted(names):
            raise BadInput(400, f"the numpy body holds {sorted(given)}; the model's inputs are "
                                f"{names}, one array each (a .npz keyed by input name)")
        return given
    value = json_body(body)
    given = value.get("inputs") if isinstance(value, dict) else None
    if not isinstance(given, dict) or sorted(given) != sorted(names):
        have = sorted(given) if isinstance(given, dict) else "none"
        raise BadInput(400, f'JSON body must be {{"inputs": {{...}}}} with one array for each '
                            f"of the model's inputs {names} (it has {have})")
    return given


def numpy_inputs(body: bytes, limits: Limits, names: list[str]) -> dict:
    """The arrays of a ``.npy`` body (the one input of ``names``) or a ``.npz`` body (by name).
    Read without pickles, each array's header checked against the bytes that follow it before
    anything is allocated, and a zip's members, uncompressed, within ``--max-body-bytes``: a
    small body never becomes a large array."""
    import io
    import zipfile

    if body[:6] == NPY:
        if len(names) != 1:
            raise BadInput(400, f"a .npy body holds one array; the model's inputs are {names}: "
                                "send a .npz keyed by input name")
        return {names[0]: npy_array(body, names[0])}
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as z:
            members = z.infolist()
            if sum(m.file_size for m in members) > limits.max_body_bytes:
                raise BadInput(413, f"the .npz body's arrays take "
                                    f"{sum(m.file_size for m in members)} bytes uncompressed, "
                                    f"over --max-body-bytes={limits.max_body_bytes}")
            return {m.filename.removesuffix(".npy"): npy_array(z.read(m), m.filename)
                    for m in members}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError,
            ValueError, EOFError) as e:
        raise BadInput(400, f"body is not a readable .npz ({type(e).__name__}: {e})") from None


def npy_array(data: bytes, name: str):
    """One ``.npy`` file's array, its header checked against the bytes that follow."""
    import io

    import numpy as np
    from numpy.lib import format as npy

    f = io.BytesIO(data)
    try:
        version = npy.read_magic(f)
        header = (npy.read_array_header_1_0 if version == (1, 0) else
                  npy.read_array_header_2_0)(f)
    except (ValueError, SyntaxError, EOFError) as e:
        raise BadInput(400, f"input {name}: not a .npy array ({e})") from None
    shape, fortran, dtype = header
    if dtype.hasobject:
        raise BadInput(400, f"input {name}: a .npy of Python objects (pickles) is never read")
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    rest = data[f.tell():]
    if len(rest) != need:
        raise BadInput(400, f"input {name}: its .npy header says {list(shape)} {dtype} "
                            f"({need} bytes) and {len(rest)} bytes follow")
    return np.frombuffer(rest, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def array_feeds(given: dict, inputs) -> dict:
    """Each of ``inputs`` (``ArrayInput`` records, the batch axis first) from its value in
    ``given``, cast to its dtype and checked against its declared shape: the feeds of a batch of
    one; a value that does not fit is one 400 line naming the input."""
    import numpy as np

    feeds = {}
    for i in inputs:
        declared = list(i.shape[1:])
        try:
            a = np.asarray(given[i.name], dtype=i.dtype)
        except (ValueError, TypeError, OverflowError) as e:
            raise BadInput(400, f"input {i.name}: not an array of {i.dtype} ({e})") from None
        if a.ndim != len(declared) or any(isinstance(d, int) and d != s
                                          for d, s in zip(declared, a.shape)):
            raise BadInput(400, f"input {i.name}: an array of shape {list(a.shape)}; the "
                                f"model takes {declared} for one sample (no batch axis)")
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            raise BadInput(400, f"input {i.name}: holds NaN or infinity")
        feeds[i.name] = a[None]
    return feeds


def check_input(feeds: dict, limits: Limits, what: str) -> None:
    """The model's input is bounded too, not only the bytes and the header: a tiny image of an
    extreme aspect (16384x1) is brought to the model's height keeping the aspect, a line 524288
    wide, and its activations alone take gigabytes. ``what``: the request as received."""
    values = sum(int(v.size) for v in feeds.values())
    if values > limits.max_input_values:
        shapes = ", ".join("x".join(map(str, v.shape)) for v in feeds.values())
        raise BadInput(413, f"{what} becomes a model input of {shapes} ({values} values), over "
                            f"the limit of {limits.max_input_values} (--max-input-values); "
                            "not run")
