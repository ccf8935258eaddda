"""Will libpng read a PNG's pixel rows without error? Checked in Python before torchvision decodes it.

torchvision's decode_png (0.29) turns libpng errors raised while it reads the rows (png_read_row) into a
longjmp across C++ frames: the process dies (segfault / abort) instead of raising, so one corrupt PNG in a
shard would kill a training worker. Errors in the header (png_read_info) and reads past the end of the data
do raise. This check covers what png_read_row can hit: the IDAT chunks that hold the image (complete, CRCs
right), their zlib stream (inflates without error to at least the bytes the image needs) and the row filter
bytes (0..4). A PNG failing it is not given to torchvision (torch_exec.decode_rgb tries PIL, which raises
on such data, and the sample is dropped).
"""

from __future__ import annotations

import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
# Adam7 passes: (x0, y0, dx, dy)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def is_png(encoded: bytes) -> bool:
    return encoded[:8] == PNG_SIGNATURE


def _row_layout(width: int, height: int, bits_per_pixel: int, interlaced: bool) -> list[tuple[int, int]]:
    """(rows, bytes per row incl. the filter byte) of each pass of the filtered image data."""
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    out = []
    for x0, y0, dx, dy in passes:
        w = (width - x0 + dx - 1) // dx if width > x0 else 0
        h = (height - y0 + dy - 1) // dy if height > y0 else 0
        if w and h:
            out.append((h, (w * bits_per_pixel + 7) // 8 + 1))
    return out


def png_rows_readable(encoded: bytes) -> bool:
    """False when reading this PNG's rows would hit a libpng error (see the module docstring); True for
    intact PNGs (and for anything that is not a PNG: nothing to say)."""
    if not is_png(encoded):
        return True
    data = memoryview(encoded)
    pos, ihdr, idat, in_idat = 8, None, [], False
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        ctype = bytes(data[pos + 4 : pos + 8])
        end = pos + 12 + length
        if ctype == b"IDAT":
            if end > len(data):
                return False
            if zlib.crc32(data[pos + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
                return False
            idat.append(bytes(data[pos + 8 : end - 4]))
            in_idat = True
        elif in_idat:
            break  # the image data ends at the first chunk after the IDAT run
        elif ctype == b"IHDR":
            if length != 13 or end > len(data):
                return False
            ihdr = bytes(data[pos + 8 : pos + 21])
        pos = end
    if ihdr is None or not idat:
        return False
    width, height = int.from_bytes(ihdr[0:4], "big"), int.from_bytes(ihdr[4:8], "big")
    depth, colour, interlace = ihdr[8], ihdr[9], ihdr[12]
    if colour not in _CHANNELS or depth not in (1, 2, 4, 8, 16) or interlace not in (0, 1):
        return False  # torchvision's header checks raise on these; nothing crashes
    layout = _row_layout(width, height, depth * _CHANNELS[colour], interlace == 1)
    need = sum(h * row for h, row in layout)
    try:
        raw = zlib.decompressobj().decompress(b"".join(idat), need)
    except zlib.error:
        return False
    if len(raw) < need:
        return False
    start = 0
    for h, row in layout:
        if max(raw[start : start + h * row : row]) > 4:  # each row's filter byte: None, Sub, Up, Average, Paeth
            return False
        start += h * row
    return True
