"""Tests of data loading (built-in sets, files, column mapping), arith and PromptSampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.data import (
    DATASETS,
    DEFAULT_TEMPLATE,
    Example,
    LoadedData,
    PromptSampler,
    load_dataset,
    make_arith,
    resolve_data_dir,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

needs_data = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} not found")


def _user_text(ex: Example) -> str:
    return [m["content"] for m in ex.prompt if m["role"] == "user"][-1]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------------------------
# Built-in sets
# --------------------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_named_sets_load(name):
    data = load_dataset(name, limit=20, data_dir=DATA)
    assert isinstance(data, LoadedData)
    assert len(data) == 20 and data.skipped == 0
    assert data.source.endswith(DATASETS[name].path)
    for ex in data:
        assert isinstance(ex.prompt, list) and ex.prompt[-1]["role"] == "user"
        assert _user_text(ex).strip()
        assert "boxed" in _user_text(ex)
        assert isinstance(ex.label, str) and ex.label.strip()
        assert "$" not in ex.label.replace("\\$", "")
        assert ex.meta["dataset"] == name and ex.meta["line"] >= 1


@needs_data
def test_named_set_mappings():
    assert load_dataset("amc23", limit=1, data_dir=DATA)[0].label == "27"
    assert load_dataset("gsm8k", limit=1, data_dir=DATA)[0].label == "18"
    assert load_dataset("minerva_math", limit=1, data_dir=DATA)[0].label == "1.6"
    ob = load_dataset("olympiadbench", limit=20, data_dir=DATA)
    assert ob[0].label == "2" and ob[1].label == "\\frac{1}{2 n+2}"
    sv = load_dataset("svamp", limit=1, data_dir=DATA)[0]
    assert sv.label == "145"
    assert _user_text(sv).startswith(
        "There are 87 oranges and 290 bananas in Philip's collection. If the bananas are organized "
        "into 2 groups and oranges are organized into 93 groups How big is each group of bananas?"
    )
    m5 = load_dataset("math500", limit=1, data_dir=DATA)[0]
    assert m5.label == "\\left( 3, \\frac{\\pi}{2} \\right)" and m5.meta["level"] == 2
    assert _user_text(m5).endswith("put your final answer within \\boxed{}.")
    tr = load_dataset("math_level3to5", limit=3, data_dir=DATA)
    assert [m["role"] for m in tr[0].prompt] == ["system", "user"] and tr[0].label == "118"


@needs_data
def test_math_level3to5_skips_empty_labels_by_default():
    data = load_dataset("math_level3to5", data_dir=DATA)
    assert data.skipped == 2 and len(data) == 8521
    with pytest.raises(ValueError, match=r"train\.jsonl line 5055: empty label"):
        load_dataset("math_level3to5", data_dir=DATA, skip_bad_rows=False)


@needs_data
def test_template_and_system_prompt():
    ex = load_dataset("gsm8k", limit=1, data_dir=DATA, template="Q: {problem}\nA:", system_prompt="Be brief.")[0]
    assert ex.prompt[0] == {"role": "system", "content": "Be brief."}
    assert ex.prompt[1]["content"].startswith("Q: Janet") and ex.prompt[1]["content"].endswith("\nA:")
    # a system prompt replaces the data set's own system message
    tr = load_dataset("math_level3to5", limit=1, data_dir=DATA, system_prompt="S")[0]
    assert [m["role"] for m in tr.prompt] == ["system", "user"] and tr.prompt[0]["content"] == "S"
    alias = load_dataset("gsm8k", limit=1, data_dir=DATA, template="{prompt} \\boxed{}")[0]
    assert alias.prompt[0]["content"].endswith("farmers' market? \\boxed{}")
    with pytest.raises(ValueError, match="problem"):
        load_dataset("gsm8k", limit=1, data_dir=DATA, template="no placeholder")


def test_default_template_asks_for_boxed():
    assert DEFAULT_TEMPLATE.format(problem="P").endswith("within \\boxed{}.")


def test_missing_data_dir_names_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_dataset("gsm8k", data_dir=tmp_path)
    assert str(tmp_path / "gsm8k" / "test.jsonl") in str(e.value)


def test_data_dir_from_env(tmp_path, monkeypatch):
    (tmp_path / "aime24").mkdir()
    _write_jsonl(tmp_path / "aime24" / "test.jsonl", [{"problem": "1+1?", "answer": "2"}])
    monkeypatch.setenv("SPARSERL_DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path.resolve()
    data = load_dataset("aime24")
    assert [e.label for e in data] == ["2"]


def test_unknown_spec():
    with pytest.raises(ValueError, match="unknown data set 'nope'"):
        load_dataset("nope")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_dataset("missing.jsonl")
    with pytest.raises(ValueError, match="split"):
        load_dataset("gsm8k", split="train", data_dir=DATA)


# --------------------------------------------------------------------------------------------
# Files and column mapping
# --------------------------------------------------------------------------------------------

GOOD = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]


def test_jsonl_file_default_mapping(tmp_path):
    path = _write_jsonl(tmp_path / "foo.jsonl", GOOD)
    data = load_dataset(str(path))
    assert [e.label for e in data] == ["1", "2", "3", "4", "5"]
    assert _user_text(data[2]).startswith("What is 2 + 1?\nPlease reason step by step")
    assert data[2].meta["line"] == 3 and data[2].meta["source"] == str(path)
    assert len(load_dataset(str(path), limit=2)) == 2


def test_malformed_jsonl_names_file_and_line(tmp_path):
    rows = [json.dumps(r) for r in GOOD[:3]] + ["", '{"problem": "x", "answer": ', json.dumps(GOOD[3])]
    path = _write_jsonl(tmp_path / "foo.jsonl", rows)
    with pytest.raises(ValueError) as e:
        load_dataset(str(path))
    assert "foo.jsonl line 5: invalid JSON" in str(e.value)
    data = load_dataset(str(path), skip_bad_rows=True)
    assert len(data) == 4 and data.skipped == 1


def test_missing_key_names_key_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "bar.jsonl", GOOD[:2] + [{"problem": "no answer here"}] + GOOD[2:])
    with pytest.raises(ValueError) as e:
        load_dataset(str(path))
    msg = str(e.value)
    assert "bar.jsonl line 3" in msg and "'answer'" in msg
    with pytest.raises(ValueError, match="missing key 'q'"):
        load_dataset(str(path), prompt_key="q", label_key="answer")


def test_skip_bad_rows_counts(tmp_path):
    rows = (
        GOOD[:2]
        + [
            "{broken",
            {"problem": "no label"},
            {"problem": "empty label", "answer": "  "},
            {"problem": "", "answer": "3"},
            [1, 2, 3],
            {"problem": "null label", "answer": None},
        ]
        + GOOD[2:]
    )
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    data = load_dataset(str(path), skip_bad_rows=True)
    assert data.skipped == 6
    assert [e.label for e in data] == ["1", "2", "3", "4", "5"]
    with pytest.raises(ValueError, match="mixed.jsonl line 3"):
        load_dataset(str(path))


def test_key_overrides_and_label_kinds(tmp_path):
    rows = [
        {"q": "a", "sol": "work... #### 1,250", "n": 27.0, "lst": ["$69$", "$84$"]},
        {"q": "b", "sol": "so \\boxed{\\frac{1}{2}}.", "n": 3, "lst": ["$x$"]},
    ]
    path = _write_jsonl(tmp_path / "k.jsonl", rows)
    assert [e.label for e in load_dataset(str(path), prompt_key="q", label_key="sol")] == ["1250", "\\frac{1}{2}"]
    assert [e.label for e in load_dataset(str(path), prompt_key="q", label_key="n")] == ["27", "3"]
    lst = load_dataset(str(path), prompt_key="q", label_key="lst")
    assert [e.label for e in lst] == ["69, 84", "x"]  # the parts of reward.math.normalize_label


def test_chat_message_prompts_kept(tmp_path):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi \\boxed{}"}]
    path = _write_jsonl(
        tmp_path / "c.jsonl", [{"prompt": msgs, "label": "1"}, {"prompt": [{"role": "user"}], "label": "2"}]
    )
    with pytest.raises(ValueError, match="c.jsonl line 2"):
        load_dataset(str(path))
    data = load_dataset(str(path), skip_bad_rows=True)
    assert data[0].prompt == msgs and data.skipped == 1


def test_parquet_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"prompt": [{"role": "user", "content": f"What is {i} + 2? \\boxed{{}}"}], "label": str(i + 2)}
        for i in range(6)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    _write_jsonl(tmp_path / "train.jsonl", rows)
    from_parquet = load_dataset(str(tmp_path / "train.parquet"))
    from_jsonl = load_dataset(str(tmp_path / "train.jsonl"))
    assert [(e.prompt, e.label) for e in from_parquet] == [(e.prompt, e.label) for e in from_jsonl]
    assert from_parquet[0].meta["row"] == 1
    # a folder with one file per split
    assert [e.label for e in load_dataset(str(tmp_path), split="train", limit=2)] == ["2", "3"]


def test_json_array_file(tmp_path):
    path = tmp_path / "arr.json"
    path.write_text(json.dumps(GOOD))
    assert [e.label for e in load_dataset(str(path))] == ["1", "2", "3", "4", "5"]


# --------------------------------------------------------------------------------------------
# arith
# --------------------------------------------------------------------------------------------


def _check_arith(examples):
    for ex in examples:
        value = eval(ex.meta["expression"], {"__builtins__": {}})  # our own digits/ops
        assert ex.label == str(value) and value >= 0
        text = _user_text(ex)
        assert text.endswith("Put the final answer in \\boxed{}.")
        for number in ex.meta["expression"].replace("(", " ").replace(")", " ").split():
            if number.isdigit():
                assert number in text


def test_arith_deterministic_and_correct():
    a = make_arith(200, seed=3)
    assert a == make_arith(200, seed=3)
    assert a != make_arith(200, seed=4)
    assert make_arith(50, seed=3) == a[:50]
    _check_arith(a)
    # default difficulty: one-digit addition of two terms, a mix of word and plain problems
    for ex in a:
        x, op, y = ex.meta["expression"].split()
        assert op == "+" and 1 <= int(x) <= 9 and 1 <= int(y) <= 9
    plain = sum(_user_text(e).split()[0] in ("What", "Compute", "Calculate", "Find") for e in a)
    assert 20 < plain < 150


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(digits=2, ops=("+", "-"), terms=3),
        dict(digits=1, ops=("-",), terms=4),
        dict(digits=2, ops=("+", "-", "*"), terms=3, word_problems=False),
        dict(difficulty=7),
    ],
)
def test_arith_options(kwargs):
    ex = make_arith(100, seed=1, **kwargs)
    _check_arith(ex)
    if kwargs.get("word_problems") is False:
        assert all(_user_text(e).split()[0] in ("What", "Compute", "Calculate", "Find") for e in ex)


def test_arith_spec():
    data = load_dataset("arith:n=30,seed=2,digits=2,ops=+-,word_problems=false")
    assert len(data) == 30 and data.source.startswith("arith")
    assert data.examples == make_arith(30, seed=2, digits=2, ops="+-", word_problems=False)
    assert len(load_dataset("arith", limit=7)) == 7
    sp = load_dataset("arith:n=3", system_prompt="S", template="Solve: {problem}")
    assert sp[0].prompt[0]["role"] == "system" and sp[0].prompt[1]["content"].startswith("Solve: ")
    for bad in ("arith:digits=x", "arith:color=red", "arith:ops=/", "arith:n"):
        with pytest.raises(ValueError, match="arith"):
            load_dataset(bad)


# --------------------------------------------------------------------------------------------
# PromptSampler
# --------------------------------------------------------------------------------------------


def _ids(batch):
    return [e.meta["index"] for e in batch]


def test_sampler_epochs_are_permutations():
    ex = make_arith(10, seed=0)
    s = PromptSampler(ex, batch_size=5, seed=1)
    first = _ids(next(s)) + _ids(next(s))
    second = _ids(next(s)) + _ids(next(s))
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second and first != list(range(10))
    assert s.state_dict()["epoch"] == 2
    assert _ids(PromptSampler(ex, 10, seed=1).next_batch()) == first
    assert _ids(PromptSampler(ex, 10, seed=2).next_batch()) != first


def test_sampler_resume_same_order():
    ex = make_arith(13, seed=0)
    ref = PromptSampler(ex, batch_size=4, seed=7)
    batches = [_ids(next(ref)) for _ in range(12)]  # crosses several epoch boundaries
    a = PromptSampler(ex, batch_size=4, seed=7)
    for _ in range(5):
        next(a)
    state = json.loads(json.dumps(a.state_dict()))  # survives a checkpoint
    b = PromptSampler(ex, batch_size=4, seed=999)
    b.load_state_dict(state)
    assert [_ids(next(b)) for _ in range(7)] == batches[5:]
    with pytest.raises(ValueError, match="13 examples"):
        PromptSampler(ex[:5], 4).load_state_dict(state)
