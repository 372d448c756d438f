"""A user's data set, read through Hugging Face ``datasets``, with a digest of its content and
two disjoint splits (calibration, evaluation).

In: a ``DataConfig``. Out: ``UserData``: the ``datasets.Dataset``, a sha256 over the content of
every file it was read from (so a data set edited in place gets a new digest, and every stage key
that reads it changes), whether it has labels, and the two splits as index lists.
``datasets`` does the reading (its packaged ``imagefolder``, ``csv``, ``json`` and ``parquet``
builders and ``load_from_disk``, none of which touches the network); this module only checks what
it got. It does not preprocess: see ``pipeline.data.images``.
"""
from __future__ import annotations

import csv
import errno
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import userfiles
from pipeline.config.data import DataConfig, DataFormat
from pipeline.core.errors import ConfigError, StageError, describe_os_error

_BUILDER = {DataFormat.csv: "csv", DataFormat.jsonl: "json", DataFormat.parquet: "parquet"}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class UserData:
    dataset: object            # datasets.Dataset
    digest: str                # sha256 over every file the data was read from
    has_labels: bool
    calibration: list[int]     # row indices, disjoint from evaluation
    evaluation: list[int]


def load(cfg: DataConfig, cache_dir: str | None = None, input_column: bool = True) -> UserData:
    """``cache_dir``: where ``datasets`` may keep the Arrow files it builds (default: its own).
    ``input_column``: check that ``cfg.input_column`` is a column (a model with several inputs
    that reads a column per input checks its own columns)."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(cfg.path)
    if not path.exists():
        raise ConfigError(f"data.path={cfg.path}: no such file or folder")
    extra = [Path(cfg.labels)] if cfg.format == DataFormat.labels_file else []
    # Before anything reads it: every file under the folder, links resolved, stays inside it,
    # and so does every file its own files name (a saved set's shards); the digest covers them.
    key = f"data.path={cfg.path}"
    digest = userfiles.digest(path, key, *extra)
    if cfg.format == DataFormat.saved and path.is_dir():
        saved_files(path, key)
    if cfg.format in (DataFormat.csv, DataFormat.jsonl) and path.is_file() and \
            not utf8(path, key):  # datasets says "StopIteration" or "no data" of an empty file
        raise StageError(f"{key}: no samples found (an empty {cfg.format.value} file)")
    verbosity = datasets.logging.get_verbosity()
    # datasets logs a failed read before raising it: the one line below says it, with the file.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        ds = _read(cfg, path, cache_dir)
    except (ConfigError, StageError):
        raise
    except Exception as e:  # noqa: BLE001 - datasets' own errors name the file; keep one line
        if (isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                and cache_dir and str(e.filename or "").startswith(cache_dir)):
            raise StageError(f"{cache_dir} (datasets' cache, under data_dir) is not writable "
                             f"({describe_os_error(e)})") from None
        if cfg.format == DataFormat.jsonl and path.is_file():  # datasets names no line: find it
            jsonl_rows(path, f"data.path={cfg.path}")
        raise StageError(f"data.path={cfg.path}: cannot be read as {cfg.format.value} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    finally:
        datasets.logging.set_verbosity(verbosity)
    if len(ds) == 0:
        raise StageError(f"data.path={cfg.path}: no samples found (format {cfg.format.value})")
    for column in cfg.pair_columns or ([cfg.input_column] if input_column else []):
        if column not in ds.column_names:
            key = (f"pair_columns={list(cfg.pair_columns)}: {column} is" if cfg.pair_columns
                   else f"input_column={column}:")
            raise ConfigError(f"data.{key} not a column of {cfg.path} "
                              f"(columns: {', '.join(ds.column_names)})")
    has_labels = cfg.label_column in ds.column_names
    cal, ev = splits(len(ds), cfg.calibration_samples, cfg.evaluation_samples, cfg.seed)
    return UserData(ds, digest, has_labels, cal, ev)


def saved_files(folder: Path, key: str) -> list[Path]:
    """The files ``load_from_disk`` will open, as the saved set's own JSON names them (the Arrow
    shards in ``state.json``; a DatasetDict's split folders in ``dataset_dict.json``, each a
    saved set), each refused unless it lies inside ``folder``. Malformed JSON is left to
    ``datasets`` to report."""
    if (folder / "dataset_info.json").is_file() and (folder / "state.json").is_file():
        return _shards(folder, folder, key)
    if (folder / "dataset_dict.json").is_file():
        index = _json(folder / "dataset_dict.json")
        names = index.get("splits") if isinstance(index, dict) else None
        return [f for name in names or [] if isinstance(name, str)
                for f in _shards(userfiles.inside(folder, name, key, "dataset_dict.json"),
                                 folder, key)]
    return []


def _shards(split: Path, root: Path, key: str) -> list[Path]:
    """A saved set's Arrow files, joined to its folder (as datasets joins them), inside root."""
    state = _json(split / "state.json")
    entries = state.get("_data_files") if isinstance(state, dict) else None
    source = str((split.resolve() / "state.json").relative_to(root.resolve()))
    return [userfiles.inside(root, e["filename"], key, source, start=split)
            for e in entries or [] if isinstance(e, dict) and isinstance(e.get("filename"), str)]


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # missing or malformed: datasets reports it when it reads
        return None


def _read(cfg: DataConfig, path: Path, cache_dir: str | None = None):
    from datasets import load_dataset, load_from_disk

    if cfg.format == DataFormat.saved:
        ds = load_from_disk(str(path))
        if hasattr(ds, "keys"):  # a DatasetDict: the user must say which split (one is enough)
            names = list(ds.keys())
            if len(names) != 1:
                raise ConfigError(f"data.path={cfg.path}: a saved DatasetDict with splits "
                                  f"{', '.join(names)}; point data.path at one split's folder")
            ds = ds[names[0]]
        return ds
    if cfg.format == DataFormat.imagefolder:
        if not path.is_dir():
            raise ConfigError(f"data.path={cfg.path}: format=imagefolder needs a folder")
        if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.rglob("*") if p.is_file()):
            raise StageError(f"data.path={cfg.path}: no samples found (no image files)")
        # A flat folder has no label subfolders: imagefolder then gives no label column.
        flat = not any(p.is_dir() for p in path.iterdir())
        ds = load_dataset("imagefolder", data_dir=str(path), split="train", drop_labels=flat,
                          cache_dir=cache_dir)
        return ds.rename_column("image", cfg.input_column) if cfg.input_column != "image" else ds
    if cfg.format == DataFormat.labels_file:
        return _labels_file(cfg, path)
    return load_dataset(_BUILDER[cfg.format], data_files=str(path), split="train",
                        cache_dir=cache_dir)


def _labels_file(cfg: DataConfig, folder: Path):
    """A folder of images plus a CSV or JSONL naming each file and its label."""
    from datasets import Dataset, Image

    labels = Path(cfg.labels)
    if not labels.is_file():
        raise ConfigError(f"data.labels={cfg.labels}: no such file")
    if labels.suffix.lower() == ".csv":
        utf8(labels, f"data.labels={cfg.labels}")
        with open(labels, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = jsonl_rows(labels, f"data.labels={cfg.labels}")
    files, targets = [], []
    root = folder.resolve()
    for n, row in enumerate(rows, 1):
        missing = [c for c in (cfg.file_column, cfg.label_column) if c not in row]
        if missing:
            raise ConfigError(f"data.labels={cfg.labels}: row {n} has no {', '.join(missing)} "
                              f"column (columns: {', '.join(row)})")
        f = (folder / str(row[cfg.file_column])).resolve()
        if root not in f.parents:  # a label file must not reach outside the data folder
            raise ConfigError(f"data.labels={cfg.labels}: row {n} names {row[cfg.file_column]}, "
                              f"outside data.path={cfg.path}")
        if not f.is_file():
            raise StageError(f"data.labels={cfg.labels}: row {n} names {row[cfg.file_column]}, "
                             f"which is not in {cfg.path}")
        files.append(str(f))
        targets.append(row[cfg.label_column])
    ds = Dataset.from_dict({cfg.input_column: files, cfg.label_column: targets})
    return ds.cast_column(cfg.input_column, Image())


def jsonl_rows(path: Path, what: str) -> list[dict]:
    """Every non-blank line of a JSONL file as an object; one line naming the file's line and the
    cause for the first that is not valid JSON or not an object (a list row, a bare string)."""
    rows = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip(b"\r\n"))
            except json.JSONDecodeError as e:
                raise StageError(f"{what}: line {n}: not valid JSON ({e.msg} at column "
                                 f"{e.colno})") from None
            except UnicodeDecodeError as e:
                raise StageError(f"{what}: line {n}: not UTF-8 text (byte {e.start + 1})") from None
            if not isinstance(row, dict):
                raise StageError(f"{what}: line {n}: a JSON {type(row).__name__} where each line "
                                 'must be an object of columns ({"column": value, ...})')
            rows.append(row)
    return rows


def utf8(path: Path, what: str) -> int:
    """A text data file is UTF-8 on every line. ``datasets`` reads invalid bytes into a column
    unchecked: the row fails with a traceback only when it is drawn, and passes silently when
    it is not; so the whole file is checked before it is read, naming the first bad line.
    Returns how many lines are not blank."""
    filled = 0
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                filled += bool(line.decode("utf-8").strip())
            except UnicodeDecodeError as e:
                raise StageError(f"{what}: line {n}: not UTF-8 text (byte {e.start + 1} of the "
                                 "line); save the file as UTF-8") from None
    return filled


def splits(n: int, calibration: int, evaluation: int, seed: int) -> tuple[list[int], list[int]]:
    """Two disjoint index lists drawn by one seeded shuffle. Refuses a set too small for both:
    calibrating on evaluation samples would flatter the quantized model."""
    import numpy as np

    if calibration + evaluation > n:
        raise StageError(f"the data set has {n} samples, fewer than calibration_samples="
                         f"{calibration} + evaluation_samples={evaluation}; lower them or add data")
    order = np.random.default_rng(seed).permutation(n)
    cal = sorted(int(i) for i in order[:calibration])
    ev = sorted(int(i) for i in order[calibration:calibration + evaluation])
    assert not set(cal) & set(ev)
    return cal, ev
