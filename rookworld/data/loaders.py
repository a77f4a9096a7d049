"""Load Samples from the project's JSON lines, RookWorld text lines or a
Hugging Face dataset (`text` column), validating every row.

    >>> res = load_samples("../shared/data/rook_val_500.txt", on_defect="relabel")  # doctest: +SKIP
    >>> print(res.report.summary())                                                 # doctest: +SKIP

on_defect: "drop" drops every row with a defect; "relabel" rebuilds fixable
rows from their own fields (`B:` = argmax(E), the A completion from the oracle,
the canonical FEN) and drops the rest. Either way the report counts each class.
Text is always rebuilt by `policy_sample`/`env_sample`, so column padding of
the source does not matter. Raises ValueError when no usable row is left.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import current_process, get_all_start_methods, get_context
from pathlib import Path

import chess

from rookworld.chess_tasks import Sample, env_sample, policy_sample
from rookworld.chess_tasks.environment import split_env_line
from rookworld.chess_tasks.policy import parse_policy_line

from .cache import cached
from .validate import FIXABLE, DefectReport, check_env, check_policy

ON_DEFECT = ("drop", "relabel")


@dataclass
class LoadResult:
    samples: list[Sample]
    report: DefectReport


def read_lines(path: Path) -> list[str]:
    """Lines of a text or gzip file (sniffed by magic bytes); undecodable bytes
    become U+FFFD so junk is reported, not raised."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
            raise ValueError(f"{path}: not a valid gzip file ({e})") from e
    return data.decode("utf-8", errors="replace").splitlines()


def _record_from_text(line: str, source: str) -> tuple | None:
    """("P", fen, moves, evals, best, source) or ("A", fen, move, history, completion);
    None when the line is neither."""
    if "\ufffd" in line or "\x00" in line:
        return None
    if line.startswith("P:"):
        fen, parsed = parse_policy_line(line)
        if not parsed.ok and parsed.reason != "moves and evals differ in count":
            return None  # (a count mismatch alone is an "eval_count" defect, not junk)
        return ("P", fen, parsed.moves, parsed.evals, parsed.best, source)
    split = split_env_line(line)
    if split is None:
        return None
    fields = split[0][3:].split("+")
    if len(fields) != 4 or len(split[1].split("+")) != 4:
        return None
    fen, move, history, _ = fields
    return ("A", fen.strip(), move.strip(), tuple(history.split()), split[1].strip())


def _record_from_json(line: str) -> tuple[tuple | None, Sample | None]:
    try:
        sample = Sample.from_json(json.loads(line))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None
    t = sample.truth
    if sample.task == "P":
        return ("P", t.fen, t.moves, t.evals, t.best, t.source), sample
    return ("A", t.fen, t.move, t.history, sample.completion), sample


def _build(rec: tuple, meta: dict) -> Sample:
    """The sample the record stands for, with canonical FEN and labels."""
    fen = chess.Board(rec[1]).fen()
    if rec[0] == "P":
        return policy_sample(fen, rec[2], rec[3], source=rec[5], meta=meta)
    return env_sample(fen, rec[2], rec[3], meta=meta)


def _defects(rec: tuple) -> list[str]:
    if rec[0] == "P":
        return check_policy(rec[1], rec[2], rec[3], rec[4])
    return check_env(rec[1], rec[2], rec[3], rec[4])


PARALLEL_ROWS = 20_000  # fewer rows than this are checked in-process: a pool would cost more


def load_lines(lines, source: str, on_defect: str = "drop", json_rows: bool | None = None,
               tasks: str = "PA", workers: int | None = None) -> LoadResult:
    """Validate and build samples from lines (JSON rows, or RookWorld text when
    json_rows is False; None sniffs the first non-blank line). `tasks` keeps only
    those tasks (rows of other tasks are skipped, not counted as defects). workers:
    processes that check contiguous slices of PARALLEL_ROWS rows or more (None = the
    CPUs this process may use); the result is the same for any number."""
    if on_defect not in ON_DEFECT:
        raise ValueError(f"on_defect={on_defect!r}; choose one of {ON_DEFECT}")
    lines = [ln for ln in lines if ln.strip()]
    if json_rows is None:
        json_rows = bool(lines) and lines[0].lstrip().startswith("{")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if not _may_fork():
        workers = 1
    n = max(1, min(workers, len(lines) // PARALLEL_ROWS))
    cuts = [len(lines) * k // n for k in range(n + 1)]
    jobs = [(lines[a:b], a, source, on_defect, json_rows, tasks) for a, b in zip(cuts, cuts[1:])]
    if n == 1:
        parts = [_load_range(*jobs[0])]
    else:
        with ProcessPoolExecutor(n, mp_context=get_context("fork")) as pool:
            parts = list(pool.map(_load_range, *zip(*jobs)))
    report, samples = DefectReport(source, on_defect), []
    for part_samples, part in parts:  # in row order, so each class keeps its first example
        samples += part_samples
        report.rows += part.rows
        report.dropped += part.dropped
        report.relabelled += part.relabelled
        report.counts.update(part.counts)
        for d, row in part.examples.items():
            report.examples.setdefault(d, row)
    report.kept = len(samples)
    if not samples:
        raise ValueError(f"no usable rows in {source}:\n{report.summary()}")
    return LoadResult(samples, report)


def _may_fork() -> bool:
    """Workers are forked only from a process with no other Python thread (a lock another
    thread holds at the fork stays held in the child), and not from a daemonic process
    (multiprocessing refuses it children)."""
    return threading.active_count() == 1 and "fork" in get_all_start_methods() and \
        not current_process().daemon


def _load_range(lines: list[str], first: int, source: str, on_defect: str, json_rows: bool,
                tasks: str) -> tuple[list[Sample], DefectReport]:
    """Samples and defect report of rows first, first + 1, ... (one worker's slice)."""
    report, samples = DefectReport(source, on_defect), []
    for i, line in enumerate(lines, start=first):
        rec, stored = _record_from_json(line) if json_rows else (_record_from_text(line, source),
                                                                 None)
        if rec is not None and rec[0] not in tasks:
            continue
        report.rows += 1
        if rec is None:
            report.add(["unparseable"], line)
            report.dropped += 1
            continue
        sample = _validated(rec, stored, line, on_defect, report,
                            stored.meta if stored else {"source": source, "row": i})
        if sample is not None:
            samples.append(sample)
    return samples, report


def _validated(rec, stored, line, on_defect, report, meta) -> Sample | None:
    defects = _defects(rec)
    fatal = [d for d in defects if d not in FIXABLE]
    sample = None if fatal else _build(rec, meta)
    if sample is not None and stored is not None and (
            (stored.prompt, stored.completion) != (sample.prompt, sample.completion)):
        defects.append("text_mismatch")
    report.add(defects, line)
    if sample is None or (defects and on_defect == "drop"):
        report.dropped += 1
        return None
    report.relabelled += bool(defects)
    return sample


def load_samples(source, on_defect: str = "drop", split: str | None = None,
                 tasks: str = "PA") -> LoadResult:
    """Samples from a file (.jsonl[.gz] rows of `Sample.to_json()`, or RookWorld
    text lines, gzip or not), a local dataset directory, or a Hugging Face
    dataset id (column `text`; `split` picks the split, default "train")."""
    path = Path(source)
    if path.is_file():  # validated once per content and code (data/cache.py)
        json_rows = True if {".jsonl", ".json"} & set(path.suffixes) else None
        return cached(path.resolve(), (str(source), on_defect, tasks, json_rows),
                      lambda: load_lines(read_lines(path), str(source), on_defect, json_rows,
                                         tasks), LoadResult)
    return load_lines(hf_lines(str(source), split), str(source), on_defect, json_rows=False,
                      tasks=tasks)


def hf_lines(source: str, split: str | None = None) -> list[str]:
    """The `text` column of a dataset saved with `save_to_disk`, a local folder
    `datasets.load_dataset` understands, or a hub id (needs the network)."""
    import datasets
    path = Path(source)
    try:
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(source)
        else:
            ds = datasets.load_dataset(source, split=split or "train")
    except Exception as e:  # datasets' own errors are many and deep; name the source
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"not a data file, nor a dataset folder or hub id that `datasets` "
                         f"can load ({type(e).__name__}: {first})") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[split or "train"]
    if "text" not in ds.column_names:
        raise ValueError(f"{source}: no 'text' column (columns: {ds.column_names})")
    return list(ds["text"])
