"""zoo entry ``netra_yolo26``: the text-line and figure detector of ``netra-ocr==1.1.0``, a
YOLO26s trained by others, exported end to end by Ultralytics and run through the documented
command line as a user would (``benchmarks.zoo.ultralytics_entry`` does the work and says what it
measures).

In: the package's checkpoint ``netra_ocr/detectors/yolo26s_best/best.pt`` (classes ``textline``
and ``image``), which its ``YoloDetector`` loads with Ultralytics and predicts at 640 with a score
threshold of 0.25. Data: document pages made here (paragraphs of English words in the machine's
TrueType fonts, headings, and figures of smooth colour fields and shapes, on paper-toned
backgrounds with noise, as JPEG).
"""
from __future__ import annotations

import random
from pathlib import Path

from benchmarks.zoo.ultralytics_entry import Entry, measure as measure_entry

PAGES = ((850, 1100), (1100, 850), (600, 900), (1240, 1754), (700, 500), (1000, 700))
WORDS = ("invoice total amount date customer address shipping order number payment report "
         "summary section figure table results method analysis page chapter the of and to in "
         "is for on with as by at from that this be are was not model data value small large "
         "network layer answer question document review product price store city river market "
         "school music movie team game player story news world").split()


def write_pages(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` JPEG pages in ``folder`` (flat: no labels), made once per (count, seed)."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    from benchmarks.zoo import truetype_fonts

    stamp = folder / ".complete"
    if stamp.exists() and stamp.read_text() == f"{count} {seed}\n":
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fonts = [f for f in truetype_fonts() if "Math" not in f.name]
    rnd, rng = random.Random(seed), np.random.default_rng(seed)
    for k in range(count):
        w, h = rnd.choice(PAGES)
        img = Image.new("RGB", (w, h), tuple(rnd.randint(225, 255) for _ in range(3)))
        draw = ImageDraw.Draw(img)
        y, margin = rnd.randint(20, 80), rnd.randint(30, 90)
        for _ in range(rnd.randint(3, 12)):  # blocks: a figure, a heading or a paragraph
            if y > h - 60:
                break
            kind = rnd.random()
            if kind < 0.15:
                fw, fh = rnd.randint(w // 4, w - 2 * margin), rnd.randint(60, h // 3)
                fh = min(fh, h - y - 30)
                field = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
                fig = Image.fromarray(field).resize((fw, fh), Image.Resampling.BICUBIC)
                fd = ImageDraw.Draw(fig)
                for _ in range(rnd.randint(2, 6)):
                    x0, y0 = rnd.randint(0, fw), rnd.randint(0, fh)
                    fd.ellipse((x0, y0, x0 + rnd.randint(10, fw // 2), y0 + rnd.randint(10, fh)),
                               fill=tuple(rnd.randint(0, 255) for _ in range(3)))
                img.paste(fig.filter(ImageFilter.GaussianBlur(1.5)),
                          (rnd.randint(margin, max(margin, w - margin - fw)), y))
                y += fh + rnd.randint(15, 40)
                continue
            size = rnd.randint(28, 44) if kind < 0.25 else rnd.randint(13, 30)
            font = ImageFont.truetype(str(rnd.choice(fonts)), size)
            ink = tuple(rnd.randint(0, 70) for _ in range(3))
            for _ in range(1 if kind < 0.25 else rnd.randint(1, 6)):
                if y + size > h - 30:
                    break
                line = " ".join(rnd.choice(WORDS) for _ in range(40))
                room = w - 2 * margin - rnd.randint(0, w // 3)
                while draw.textlength(line, font=font) > room and " " in line:
                    line = line.rsplit(" ", 1)[0]
                draw.text((margin, y), line, font=font, fill=ink)
                y += int(size * rnd.uniform(1.3, 1.8))
            y += rnd.randint(10, 35)
        noisy = np.asarray(img, np.int16) + rng.integers(-6, 7, (h, w, 3))
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(folder / f"{k:04d}.jpg",
                                                                      quality=90)
    stamp.write_text(f"{count} {seed}\n")
    return folder


ENTRY = Entry("netra_yolo26", "netra-ocr==1.1.0",
              Path("netra_ocr") / "detectors" / "yolo26s_best" / "best.pt", "netra_yolo26s.onnx",
              "netra-ocr YOLO26s (end2end)", write_pages)


def measure(cli, quick: bool = False) -> dict:
    return measure_entry(cli, quick, ENTRY)
