"""Ultralytics' own code for the zoo's YOLO entries, run in ``.venv-ultralytics`` (``make bench``
builds it: ultralytics pulls in its own OpenCV, plotting and torchvision, which the pipeline's
``.venv`` does not need), never by the pipeline.

``export PT ONNX``: the checkpoint exported as its users export it, ``YOLO(pt).export(format=
"onnx", imgsz=640, nms=False)`` (``nms=False``: a YOLO26 checkpoint's NMS-free one-to-one head,
its rows selected inside the graph, ``[1, 300, 6]``), written to ONNX. ``predict ONNX IMAGES
OUT.json``: ``YOLO(onnx).predict`` at ``--conf`` on each image file (OpenCV's BGR, as the
package's own detector reads it): each image's boxes in its own pixels (x1, y1, x2, y2), classes
and scores, and the sha256 of the 0..255 pixels of the input Ultralytics' preprocessing made.
A failure is one line on stderr and exit 1.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path


def export(pt: Path, out: Path, imgsz: int) -> None:
    from ultralytics import YOLO

    made = Path(YOLO(str(pt)).export(format="onnx", imgsz=imgsz, nms=False, batch=1))
    tmp = out.with_suffix(".tmp")
    shutil.copyfile(made, tmp)
    tmp.replace(out)  # whole or not at all


def predict(model: Path, images: list[Path], out: Path, conf: float, imgsz: int) -> None:
    import cv2
    import numpy as np
    from ultralytics import YOLO

    yolo = YOLO(str(model), task="detect")
    rows = []
    for f in images:
        img = cv2.imread(str(f))
        r = yolo.predict(source=img, conf=conf, imgsz=imgsz, verbose=False)[0]
        made = yolo.predictor.preprocess([img]).numpy().astype(np.float64)
        rows.append({"file": f.name,  # the input's 0..255 pixels (benchmarks.zoo.netra_yolo26)
                     "input": hashlib.sha256(np.rint(made * 255).astype(np.uint8)
                                             .tobytes()).hexdigest(),
                     "boxes": r.boxes.xyxy.numpy().astype(float).round(3).tolist(),
                     "classes": r.boxes.cls.numpy().astype(int).tolist(),
                     "scores": r.boxes.conf.numpy().astype(float).round(6).tolist()})
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    tmp.replace(out)


def main() -> int:
    ap = argparse.ArgumentParser(prog="ultralytics_side")
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("pt", type=Path)
    e.add_argument("out", type=Path)
    p = sub.add_parser("predict")
    p.add_argument("model", type=Path)
    p.add_argument("images", type=Path, help="a folder of .jpg/.png files, read in name order")
    p.add_argument("out", type=Path)
    p.add_argument("--conf", type=float, default=0.25)
    for a in (e, p):
        a.add_argument("--imgsz", type=int, default=640)
    args = ap.parse_args()
    try:
        if args.cmd == "export":
            export(args.pt, args.out, args.imgsz)
        else:
            files = sorted(f for f in args.images.iterdir() if f.suffix in (".jpg", ".png"))
            predict(args.model, files, args.out, args.conf, args.imgsz)
    except Exception as exc:  # noqa: BLE001 - one line for the bench record
        print(f"ultralytics_side {args.cmd}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
