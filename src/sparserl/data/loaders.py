"""Prompt/label data sets: loading files and built-in sets into ``Example`` s, and a resumable
seeded batch sampler.

``load_dataset(spec)`` accepts
- a path to a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, or a folder holding
  ``<split>.<ext>``;
- a built-in name (:data:`DATASETS`: ``math_level3to5``, ``math500``, ``gsm8k``, ``aime24``,
  ``amc23``, ``minerva_math``, ``olympiadbench``, ``svamp``), read from the shared data folder
  (see :func:`resolve_data_dir`) with a built-in column mapping;
- ``"arith"`` or ``"arith:key=value,..."``: the generated arithmetic task
  (:func:`sparserl.data.arith.make_arith`).

Every example's prompt is a list of chat messages (``[{"role": "user", "content": ...}]``, with
an optional system message first) ready for a chat template, and its label is a string that the
math reward (docs/algorithms.md §1) compares with the response's last ``\\boxed{}``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..envpath import env_dir
from ..errors import SparserlError
from .arith import make_arith
from .example import Example

__all__ = [
    "Example",
    "LoadedData",
    "load_dataset",
    "PromptSampler",
    "DATASETS",
    "DataError",
    "DataFileNotFoundError",
    "DEFAULT_TEMPLATE",
    "resolve_data_dir",
    "read_rows",
    "read_text_lines",
    "clean_label",
    "apply_template",
]

log = logging.getLogger(__name__)

#: default template for text problems (a ``str.format`` string with ``{problem}``).
DEFAULT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

DATA_DIR_ENV = "SPARSERL_DATA_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[3]
_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass
class LoadedData(Sequence):
    """The result of :func:`load_dataset`: a list-like of ``Example`` s, the number of rows left
    out as bad (``skip_bad_rows=True``), and the source it was read from."""

    examples: list[Example]
    skipped: int
    source: str

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)


class DataError(SparserlError, ValueError):
    """A data file or data spec that cannot be read; the message names the file (and line) or the
    spec, what is wrong, and what would be valid."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file (or the folder of the built-in sets) that does not exist; names where it looked."""


class _BadRow(ValueError):
    """A row that cannot become an Example (error, or skipped with ``skip_bad_rows``)."""


# ---------------------------------------------------------------------------------------------
# Built-in data sets
# ---------------------------------------------------------------------------------------------


def _svamp_prompt(row: dict) -> str:
    body = str(_require(row, "Body")).strip()
    question = str(_require(row, "Question")).strip()
    return f"{body} {question}" if body else question


def _olympiad_prompt(row: dict) -> str:
    question = str(_require(row, "question")).strip()
    context = row.get("context")
    return f"{str(context).strip()}\n{question}" if context else question


@dataclass(frozen=True)
class BuiltinSet:
    """A named data set: file under the data folder, its split and its column mapping."""

    path: str
    split: str
    prompt_key: str
    label_key: str
    prompt_fn: Callable[[dict], Any] | None = None
    description: str = ""


#: built-in data sets by name (files under the shared data folder, see its README).
DATASETS: dict[str, BuiltinSet] = {
    "math_level3to5": BuiltinSet(
        "math_level3to5/train.jsonl",
        "train",
        "prompt",
        "label",
        description="MATH levels 3-5 (chat prompts asking for \\boxed{})",
    ),
    "math500": BuiltinSet("math500/test.jsonl", "test", "problem", "answer", description="MATH-500"),
    "gsm8k": BuiltinSet(
        "gsm8k/test.jsonl", "test", "question", "answer", description="GSM8K test; label = the number after ####"
    ),
    "aime24": BuiltinSet("aime24/test.jsonl", "test", "problem", "answer", description="AIME 2024"),
    "amc23": BuiltinSet(
        "amc23/test.jsonl", "test", "problem", "answer", description="AMC 2023; float answers 27.0 -> '27'"
    ),
    "minerva_math": BuiltinSet(
        "minerva_math/test.jsonl",
        "test",
        "problem",
        "solution",
        description="Minerva math; label = last \\boxed{} of solution",
    ),
    "olympiadbench": BuiltinSet(
        "olympiadbench/test.jsonl",
        "test",
        "question",
        "final_answer",
        prompt_fn=_olympiad_prompt,
        description="OlympiadBench (text, English); final_answer list",
    ),
    "svamp": BuiltinSet(
        "svamp/test.jsonl",
        "test",
        "Body+Question",
        "Answer",
        prompt_fn=_svamp_prompt,
        description="SVAMP; prompt = Body + ' ' + Question",
    ),
}

_PROMPT_KEYS = ("prompt", "problem", "question", "messages", "input", "query", "instruction")
_LABEL_KEYS = ("label", "answer", "final_answer", "ground_truth", "target", "solution")


def resolve_data_dir(data_dir: str | os.PathLike | None = None, relpath: str | None = None) -> Path:
    """Find the folder of the built-in data sets.

    Order: ``data_dir`` if given; else ``$SPARSERL_DATA_DIR``; else ``../shared/data`` relative
    to the current directory; else ``<repo>/../shared/data``. With ``relpath``, the first folder
    that holds that file wins. Raises ``FileNotFoundError`` naming every place it looked, and
    :class:`~sparserl.envpath.EnvPathError` when ``$SPARSERL_DATA_DIR`` is a file.
    """
    env = env_dir(DATA_DIR_ENV, create=False) if data_dir is None else None
    if data_dir is not None:
        candidates = [Path(data_dir)]
    elif env is not None:
        candidates = [env]
    else:
        candidates = [Path.cwd() / ".." / "shared" / "data", _REPO_ROOT.parent / "shared" / "data"]
    tried = []
    for c in candidates:
        target = c / relpath if relpath else c
        tried.append(str(target))
        if target.exists():
            return c.resolve()
    how = (
        "data_dir argument"
        if data_dir is not None
        else f"${DATA_DIR_ENV}"
        if env is not None
        else f"default locations (set ${DATA_DIR_ENV} or pass data_dir=)"
    )
    raise DataFileNotFoundError(f"data set file not found; looked in ({how}): {', '.join(tried)}")


# ---------------------------------------------------------------------------------------------
# Reading rows
# ---------------------------------------------------------------------------------------------


def read_text_lines(path: str | os.PathLike, what: str = "data file") -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of a UTF-8 text file (a leading BOM is dropped). A missing file raises
    :class:`DataFileNotFoundError`; bytes that are not UTF-8 (a binary file) raise
    :class:`DataError` naming the file, the line and the byte; ``what`` names the file's role."""
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            raise DataError(f"{what} {path}: is a folder, expected a file")
        raise DataFileNotFoundError(f"{what} not found: {path}")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"{what} {path}: cannot read ({e.strerror or e})") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path} line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1}); expected a text file such as JSON lines"
                ) from None
            yield lineno, (line.removeprefix("\ufeff") if lineno == 1 else line)


def _iter_jsonl(path: Path, skip_bad_rows: bool, counter: list[int]) -> list[tuple[int, Any]]:
    """Parse a JSON-lines file line by line: ``[(line_number, row)]``. A malformed line raises
    ``DataError("<file> line N: invalid JSON: ...")`` (or is skipped and counted)."""
    rows = []
    for lineno, line in read_text_lines(path):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            msg = f"{path} line {lineno}: invalid JSON: {e.msg} (column {e.colno})"
            if skip_bad_rows:
                log.warning("skipping %s", msg)
                counter[0] += 1
                continue
            raise DataError(msg) from None
    return rows


def _read_with_hf(path: Path, builder: str) -> list[tuple[int, Any]]:
    """Read a file with Hugging Face ``datasets`` (``json``, ``parquet`` or ``csv`` builder)."""
    import datasets as hf_datasets

    ds = hf_datasets.load_dataset(builder, data_files=str(path), split="train")
    return [(i + 1, row) for i, row in enumerate(ds)]


def read_rows(path: str | os.PathLike, skip_bad_rows: bool = False) -> tuple[list[tuple[int, Any]], int, str]:
    """Read the raw rows of a data file: ``(rows, n_skipped, unit)`` with ``rows`` a list of
    ``(line_or_row_number, row)`` and ``unit`` ``"line"`` (JSON lines) or ``"row"``.

    ``.jsonl`` files are parsed line by line here (so errors name the file and line and each
    row keeps its line number); ``.json``, ``.parquet`` and ``.csv`` go through Hugging Face
    ``datasets``.
    """
    path = Path(path)
    if not path.is_file():
        if path.is_dir():
            raise DataError(f"data file {path}: is a folder, expected a file")
        raise DataFileNotFoundError(f"data file not found: {path}")
    suffix = path.suffix.lower()
    counter = [0]
    if suffix == ".jsonl":
        return _iter_jsonl(path, skip_bad_rows, counter), counter[0], "line"
    text = ""
    if suffix in (".json", ".csv"):  # text formats: a binary file is a DataError naming file and line
        text = "".join(line for _, line in read_text_lines(path))
        if not text.strip():
            return [], 0, "line"  # empty: load_dataset says so
    if suffix == ".json":
        try:
            return _read_with_hf(path, "json"), 0, "row"
        except Exception as e:  # find the bad line if it is JSON lines
            if text.lstrip()[:1] != "[":
                rows = _iter_jsonl(path, skip_bad_rows, counter)  # raises with the line number
                return rows, counter[0], "line"
            raise DataError(f"{path}: cannot read JSON: {type(e).__name__}: {e}") from e
    if suffix == ".parquet":
        try:
            return _read_with_hf(path, "parquet"), 0, "row"
        except Exception as e:
            raise DataError(f"{path}: cannot read Parquet: {type(e).__name__}: {e}") from e
    if suffix == ".csv":
        try:
            return _read_with_hf(path, "csv"), 0, "row"
        except Exception as e:
            raise DataError(f"{path}: cannot read CSV: {type(e).__name__}: {e}") from e
    raise DataError(f"{path}: unsupported file type {suffix!r} (use one of {', '.join(_SUFFIXES)})")


# ---------------------------------------------------------------------------------------------
# Row → Example
# ---------------------------------------------------------------------------------------------


def _require(row: dict, key: str) -> Any:
    if key not in row:
        raise _BadRow(f"missing key {key!r} (row has keys {sorted(row)})")
    return row[key]


def clean_label(value: Any) -> str | None:
    """A label as the one string an :class:`Example` holds, or None when it is unusable: the
    parts of :func:`sparserl.reward.math.normalize_label` joined by ``", "`` (from which the
    reward reads the same parts back)."""
    from ..reward.math import normalize_label

    parts = normalize_label(value)
    return ", ".join(parts) if parts else None


def _check_template(template: str) -> None:
    if "{problem}" not in template and "{prompt}" not in template:
        raise DataError(f"template must contain '{{problem}}' (or '{{prompt}}'): {template!r}")


def apply_template(template: str, problem: str) -> str:
    """Insert ``problem`` into ``template`` at ``{problem}`` (``{prompt}`` is accepted as an
    alias): ``str.format`` rules (``{{}}`` is a literal ``{}``); a template with other single
    braces (``\\boxed{}``) is filled by plain replacement of the placeholder instead."""
    _check_template(template)
    try:
        return template.format(problem=problem, prompt=problem)
    except (KeyError, IndexError, ValueError):
        return template.replace("{problem}", problem).replace("{prompt}", problem)


def _messages(prompt: Any, template: str, system_prompt: str | None) -> list[dict[str, str]]:
    """Turn a text problem or a list of messages into chat messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise _BadRow("empty prompt")
        msgs = [{"role": "user", "content": apply_template(template, prompt.strip())}]
    elif isinstance(prompt, (list, tuple)):
        msgs = []
        for m in prompt:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise _BadRow(f"prompt messages must be dicts with 'role' and 'content', got {m!r}"[:200])
            msgs.append({"role": str(m["role"]), "content": str(m["content"])})
        if not msgs or not any(m["content"].strip() for m in msgs):
            raise _BadRow("empty prompt")
    else:
        raise _BadRow(f"prompt must be text or a list of chat messages, got {type(prompt).__name__}")
    if system_prompt is not None:
        msgs = [m for m in msgs if m["role"] != "system"]
        msgs.insert(0, {"role": "system", "content": system_prompt})
    return msgs


_META_KEYS = ("id", "idx", "ID", "unique_id", "subject", "level", "type", "Type", "subfield", "answer_type", "unit")


def _row_to_example(
    row: Any,
    *,
    prompt_key: str | None,
    label_key: str,
    prompt_fn: Callable[[dict], Any] | None,
    template: str,
    system_prompt: str | None,
    meta: dict,
) -> Example:
    if not isinstance(row, dict):
        raise _BadRow(f"row must be a JSON object, got {type(row).__name__}")
    prompt = prompt_fn(row) if prompt_fn is not None else _require(row, prompt_key)
    label = clean_label(_require(row, label_key))
    if label is None:
        raise _BadRow(f"empty label in key {label_key!r}")
    for k in _META_KEYS:
        v = row.get(k)
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            meta.setdefault(k, v)
    return Example(prompt=_messages(prompt, template, system_prompt), label=label, meta=meta)


def _candidates(preferred: str | None, common: Sequence[str]) -> tuple[str, ...]:
    """The columns a guess tries, in order: ``preferred`` first, then the common names."""
    return tuple(dict.fromkeys(([preferred] if preferred else []) + list(common)))


def _guess_key(rows: list[tuple[int, Any]], candidates: Sequence[str], what: str, path: Path, option: str) -> str:
    first = next((r for _, r in rows if isinstance(r, dict)), None)
    if first is None:
        raise DataError(
            f"{path}: no rows (the file is empty)"
            if not rows
            else f"{path}: no row is a JSON object (line {rows[0][0]} is a {type(rows[0][1]).__name__})"
        )
    for k in candidates:
        if k in first:
            return k
    sep = " " if option.startswith("--") else "="
    raise DataError(
        f"{path}: cannot tell which column is the {what} (tried {list(candidates)}; "
        f"columns are {sorted(first)}); name it with {option}{sep}<column>"
    )


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------


def _parse_arith_spec(spec: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    _, _, rest = spec.partition(":")
    for item in filter(None, (s.strip() for s in rest.split(","))):
        if "=" not in item:
            raise DataError(f"data spec {spec!r}: expected key=value, got {item!r}")
        key, value = (s.strip() for s in item.split("=", 1))
        try:
            if key in ("n", "seed", "digits", "terms", "difficulty"):
                kwargs[key] = int(value)
            elif key == "ops":
                bad = set(value) - set("+-*| ")
                if bad:
                    raise ValueError(f"unknown operations {sorted(bad)}")
                kwargs["ops"] = tuple(c for c in value if c in "+-*")
            elif key == "word_problems":
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError("expected true/false")
                kwargs["word_problems"] = value.lower() in ("1", "true", "yes")
            else:
                raise ValueError("unknown key (known: n, seed, digits, ops, terms, word_problems, difficulty)")
        except ValueError as e:
            raise DataError(f"data spec {spec!r}: {key}={value!r}: {e}") from None
    return kwargs


def _load_arith(spec: str, *, limit, template, system_prompt) -> LoadedData:
    kwargs = _parse_arith_spec(spec)
    n = kwargs.pop("n", None)
    if n is not None and n < 1:
        raise DataError(f"data spec {spec!r}: n={n}: must be >= 1")
    if n is None:
        n = limit if limit is not None else 1000
    try:
        examples = make_arith(n, **kwargs)
    except ValueError as e:  # digits=0, terms=1, ...: make_arith names the key and the valid range
        raise DataError(f"data spec {spec!r}: {e}") from None
    if limit is not None:
        examples = examples[:limit]
    if template is not None or system_prompt is not None:
        for ex in examples:
            if template is not None:
                ex.prompt = [{"role": "user", "content": apply_template(template, ex.meta["question"])}]
            if system_prompt is not None:
                ex.prompt = [{"role": "system", "content": system_prompt}] + list(ex.prompt)
    return LoadedData(examples=examples, skipped=0, source=spec)


def _find_split_file(folder: Path, split: str | None) -> Path:
    files = [p for p in sorted(folder.iterdir()) if p.suffix.lower() in _SUFFIXES and p.is_file()]
    if split is not None:
        for p in files:
            if p.stem == split:
                return p
        raise DataFileNotFoundError(f"{folder}: no file for split {split!r} (found {[p.name for p in files]})")
    if len(files) == 1:
        return files[0]
    if not files:
        raise DataFileNotFoundError(f"{folder}: no data file ({', '.join('*' + s for s in _SUFFIXES)})")
    raise DataError(f"{folder}: {len(files)} data files ({[p.name for p in files]}); pass split=")


def load_dataset(
    spec: str,
    *,
    prompt_key: str | None = None,
    label_key: str | None = None,
    template: str | None = None,
    system_prompt: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    skip_bad_rows: bool | None = None,
    data_dir: str | os.PathLike | None = None,
    preferred_keys: tuple[str | None, str | None] = (None, None),
    key_options: tuple[str, str] = ("prompt_key", "label_key"),
) -> LoadedData:
    """Load prompts and labels as :class:`Example` s (see the module docstring for ``spec``).

    - ``prompt_key`` / ``label_key``: the columns to use (override a built-in mapping; for a plain
      file they are guessed from common names when not given).
    - ``template``: ``str.format`` string with ``{problem}`` (alias ``{prompt}``) for text problems (default
      :data:`DEFAULT_TEMPLATE`, which asks for the answer in ``\\boxed{}``); prompts that are
      already chat messages are kept as they are.
    - ``system_prompt``: a system message put first (replacing any system message of the row).
    - ``split``: for a folder, which ``<split>.<ext>`` to read; for a built-in name it must be
      that set's split.
    - ``limit``: keep at most this many examples (the first ones in file order).
    - ``skip_bad_rows``: leave out malformed lines, rows missing a key, and empty prompts or
      labels, counting them in ``LoadedData.skipped``; otherwise such a row raises
      ``DataError("<file> line N: ...")`` naming the problem (e.g. the missing key). The
      default (None) is True for built-in names (``math_level3to5`` has 2 rows with an empty
      label, lines 5055 and 5159) and False for files given by path.
    - ``data_dir``: folder of the built-in sets (see :func:`resolve_data_dir`).
    - ``preferred_keys``: (prompt, label) columns tried first where a key is guessed, before the
      common names (an evaluation file gets the training set's columns where it has them).
    - ``key_options``: how the caller's user names ``prompt_key`` / ``label_key`` (``data.prompt_key``,
      ``--prompt-key``): the error of a key that cannot be guessed says to set it.

    Returns :class:`LoadedData` (list-like of examples, ``skipped``, ``source``). Every problem is a
    :class:`DataError` (a ``SparserlError`` and ``ValueError``; :class:`DataFileNotFoundError` is also a
    ``FileNotFoundError``) naming the file and line or the spec: a missing or empty file, bytes that are
    not UTF-8 text, a malformed line, a missing column, no usable example.
    """
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    spec = str(spec)
    if spec == "arith" or spec.startswith("arith:"):
        return _load_arith(spec, limit=limit, template=template, system_prompt=system_prompt)

    builtin: BuiltinSet | None = None
    dataset_name: str | None = None
    path = Path(spec).expanduser()
    if spec in DATASETS and not path.exists():
        builtin = DATASETS[spec]
        dataset_name = spec
        if split is not None and split != builtin.split:
            raise DataError(f"data set {spec!r} has only the {builtin.split!r} split, not {split!r}")
        path = resolve_data_dir(data_dir, builtin.path) / builtin.path
    elif path.is_dir():
        path = _find_split_file(path, split)
    elif not path.exists():
        if path.suffix.lower() in _SUFFIXES or os.sep in spec or "/" in spec:
            raise DataFileNotFoundError(f"data file not found: {spec}")
        raise DataError(
            f"unknown data set {spec!r}: not a file, and not a built-in name "
            f"({', '.join(DATASETS)}) or 'arith[:key=value,...]'"
        )

    if skip_bad_rows is None:
        skip_bad_rows = builtin is not None
    rows, skipped, unit = read_rows(path, skip_bad_rows=skip_bad_rows)

    prompt_fn = None
    if prompt_key is None and builtin is not None:
        prompt_key, prompt_fn = builtin.prompt_key, builtin.prompt_fn
    if label_key is None and builtin is not None:
        label_key = builtin.label_key
    prefer_prompt, prefer_label = preferred_keys
    if prompt_key is None and prompt_fn is None:
        prompt_key = _guess_key(rows, _candidates(prefer_prompt, _PROMPT_KEYS), "prompt", path, key_options[0])
    if label_key is None:
        label_key = _guess_key(rows, _candidates(prefer_label, _LABEL_KEYS), "label", path, key_options[1])
    tmpl = DEFAULT_TEMPLATE if template is None else template
    _check_template(tmpl)

    examples: list[Example] = []
    for number, row in rows:
        if limit is not None and len(examples) >= limit:
            break
        meta = {"source": str(path), unit: number}
        if dataset_name:
            meta["dataset"] = dataset_name
        try:
            examples.append(
                _row_to_example(
                    row,
                    prompt_key=prompt_key,
                    label_key=label_key,
                    prompt_fn=prompt_fn,
                    template=tmpl,
                    system_prompt=system_prompt,
                    meta=meta,
                )
            )
        except _BadRow as e:
            msg = f"{path} {unit} {number}: {e}"
            if not skip_bad_rows:
                raise DataError(f"{msg} (pass skip_bad_rows=True to leave such rows out)") from None
            if skipped < 5:
                log.warning("skipping %s", msg)
            skipped += 1
    if skipped:
        log.warning("%s: skipped %d bad row(s)", path, skipped)
    if not examples and limit != 0:
        raise DataError(
            f"{path}: no examples" + (f" ({skipped} bad rows skipped)" if skipped else " (the file is empty)")
        )
    return LoadedData(examples=examples, skipped=skipped, source=str(path))


# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------


class PromptSampler:
    """Endless batches of examples in a seeded shuffled order, epoch after epoch.

    Each epoch is a fresh permutation that depends only on ``(seed, epoch)``; batches are cut
    from the stream of epochs, so a batch may span the end of one epoch and the start of the
    next (every batch has exactly ``batch_size`` examples). ``state_dict()`` holds
    ``(epoch, position)``; a new sampler given the same examples and ``load_state_dict(state)``
    continues with exactly the batches the first one would have produced.
    """

    def __init__(self, examples: Sequence[Example], batch_size: int, seed: int = 0, shuffle: bool = True):
        self.examples = list(examples)
        if not self.examples:
            raise ValueError("PromptSampler: no examples")
        if batch_size < 1:
            raise ValueError(f"PromptSampler: batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.position = 0
        self._order_cache: tuple[int, list[int]] | None = None

    def __len__(self) -> int:
        """Batches per epoch (rounded up)."""
        return math.ceil(len(self.examples) / self.batch_size)

    def _order(self, epoch: int) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != epoch:
            order = list(range(len(self.examples)))
            if self.shuffle:
                random.Random(f"sparserl.PromptSampler:{self.seed}:{epoch}").shuffle(order)
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def next_batch(self) -> list[Example]:
        """The next ``batch_size`` examples."""
        n = len(self.examples)
        batch: list[Example] = []
        while len(batch) < self.batch_size:
            order = self._order(self.epoch)
            take = min(self.batch_size - len(batch), n - self.position)
            batch.extend(self.examples[i] for i in order[self.position : self.position + take])
            self.position += take
            if self.position >= n:
                self.epoch += 1
                self.position = 0
        return batch

    def __iter__(self) -> PromptSampler:
        return self

    def __next__(self) -> list[Example]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler is: ``epoch``, ``position`` within the epoch, plus ``seed``,
        ``num_examples``, ``batch_size`` and ``shuffle`` (checked on load)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_examples": len(self.examples),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`. The number of examples must match; the stored seed
        and shuffle flag replace this sampler's (the batch size may differ)."""
        n = state.get("num_examples", len(self.examples))
        if n != len(self.examples):
            raise ValueError(f"PromptSampler state is for {n} examples, this sampler has {len(self.examples)}")
        position = int(state["position"])
        if not 0 <= position < len(self.examples):
            raise ValueError(f"PromptSampler state: position {position} out of range")
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.epoch = int(state["epoch"])
        self.position = position
        self._order_cache = None
