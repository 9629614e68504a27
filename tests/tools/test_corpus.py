"""The committed corpus: its counts, the facts the lessons quote, the split and the integrity checks."""
from __future__ import annotations

import lzma
import os
import re
import shutil

import pytest

from kvlib.poems import count_followers
from kvlib.tools import corpus as data
from kvlib.tools.integrity import DATA_DIR, MANIFEST_NAME, IntegrityError, record, verified_path


@pytest.fixture(scope="module")
def poems() -> list[str]:
    return data.load_poems()


@pytest.fixture
def data_copy(tmp_path):
    """The corpus, its info file and the manifest, copied into a scratch folder."""
    for name in (data.CORPUS_FILE, data.INFO_FILE, MANIFEST_NAME):
        shutil.copyfile(DATA_DIR / name, tmp_path / name)
    return tmp_path


def flip_byte(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


# ---- counts ---------------------------------------------------------------------------------

def test_poem_counts_match_the_info_file(poems):
    counts = data.corpus_info()["poems"]
    assert counts["read"] == 57_607
    assert counts["written"] == len(poems) == 56_799
    assert counts["read"] - counts["dropped"] == counts["written"]
    assert sum(d["poems"] for d in counts["dropped_by_reason"].values()) == counts["dropped"]


def test_each_rule_reports_poems_changed_and_characters_removed():
    counts = data.corpus_info()["poems"]
    rules = counts["rules"]
    assert rules["notes in brackets"]["characters_removed"] > 200_000  # 6.5 % of the raw text
    assert all(r["poems_changed"] > 0 and r["characters_removed"] >= r["poems_changed"] for r in rules.values())
    dropped = counts["dropped_by_reason"]
    assert dropped["no text"]["indices"] == [51547, 53381, 55307, 56791]
    assert dropped["lost characters (□)"]["poems"] > 300
    assert all(d["poems"] == len(d["indices"]) for d in dropped.values())


def test_poem_text_keeps_no_apparatus(poems):
    allowed = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f，。！？；：、]+")
    strays = {ch for p in poems for ch in p if not allowed.fullmatch(ch)}
    assert strays == set()
    assert not any("见" in p and "卷" in p and "《" in p for p in poems)


def test_every_line_is_one_nonempty_poem(poems):
    assert all(p and "\n" not in p and p == p.strip() for p in poems)
    assert sum(len(p) for p in poems) == data.corpus_info()["characters"]


# ---- facts the lessons quote ----------------------------------------------------------------

def test_quiet_night_thought_is_the_complete_tang_poems_version(poems):
    assert "床前看月光，疑是地上霜。举头望山月，低头思故乡。" in poems
    assert not any("床前明月光，疑是地上霜。举头望明月" in p for p in poems)


def test_spring_wind_is_followed_by_a_full_stop_about_14_percent_of_the_time(poems):
    followers = count_followers(poems, "春风")
    total = sum(followers.values())
    assert followers["。"] == 169
    assert total == 1_177
    assert 0.10 <= followers["。"] / total <= 0.20


def test_count_followers_counts_overlaps_and_the_end_of_a_poem():
    counts = count_followers(["春风起，春风。", "花落春风", "无"], "春风")
    assert counts == {"起": 1, "。": 1, "\n": 1}
    assert count_followers(["aaaa"], "aa") == {"a": 2, "\n": 1}


# ---- the split ------------------------------------------------------------------------------

def test_split_is_deterministic_disjoint_and_complete(poems):
    n = len(poems)
    train_idx, val_idx = data.split(list(range(n)))
    assert set(train_idx).isdisjoint(val_idx)
    assert sorted(train_idx + val_idx) == list(range(n))
    assert data.split(list(range(n))) == (train_idx, val_idx)

    train, val = data.split(poems)
    assert train == [poems[i] for i in train_idx]
    assert val == [poems[i] for i in val_idx]
    assert abs(len(val) / n - 0.05) <= 0.001


# ---- integrity ------------------------------------------------------------------------------

def test_an_intact_copy_verifies(data_copy):
    assert verified_path(data.CORPUS_FILE, data_copy) == data_copy / data.CORPUS_FILE
    assert data.corpus_info(data_copy) == data.corpus_info()


def test_load_text_refuses_a_tampered_corpus(data_copy):
    path = data_copy / data.CORPUS_FILE
    flip_byte(path, path.stat().st_size // 2)
    with pytest.raises(IntegrityError, match=r"tang\.txt\.xz"):
        data.load_text(data_dir=data_copy)


def test_load_text_refuses_a_tampered_info_file(data_copy):
    path = data_copy / data.INFO_FILE
    path.write_text(path.read_text(encoding="utf-8").replace("56799", "56798"), encoding="utf-8")
    with pytest.raises(IntegrityError, match=r"tang\.json"):
        data.load_text(data_dir=data_copy)


def test_load_text_refuses_a_missing_corpus(data_copy):
    (data_copy / data.CORPUS_FILE).unlink()
    with pytest.raises(IntegrityError, match=r"tang\.txt\.xz.*missing"):
        data.load_text(data_dir=data_copy)


def test_load_text_refuses_a_file_the_manifest_does_not_list(tmp_path):
    shutil.copyfile(DATA_DIR / data.CORPUS_FILE, tmp_path / data.CORPUS_FILE)
    with pytest.raises(IntegrityError, match=r"no MANIFEST\.json, so tang\.txt\.xz"):
        data.load_text(data_dir=tmp_path)                  # no manifest at all: named as such
    (tmp_path / MANIFEST_NAME).write_text("{}", encoding="utf-8")
    with pytest.raises(IntegrityError, match=r"tang\.txt\.xz.*not listed"):
        data.load_text(data_dir=tmp_path)                  # a manifest without the file


def test_load_text_checks_the_text_inside_against_the_info_file(data_copy):
    # A well-formed archive recorded in the manifest, but not the text tang.json describes.
    path = data_copy / data.CORPUS_FILE
    path.write_bytes(lzma.compress("床前明月光，疑是地上霜。\n".encode("utf-8")))
    record(path, data_dir=data_copy)
    with pytest.raises(IntegrityError, match=r"tang\.json"):
        data.load_text(data_dir=data_copy)


# ---- preparation ----------------------------------------------------------------------------

def test_clean_joins_lines_separates_notes_converts_and_reports_dropped_poems():
    raw = [
        {"title": "静夜思", "paragraphs": ["床前明月光，", "疑是地上霜。（見《全唐詩》卷一六五。）"]},
        {"title": "空", "paragraphs": []},
        {"title": "白", "paragraphs": ["   ", ""]},
        {"title": "无题"},
        {"title": "登鹳雀楼", "paragraphs": [" 白日 依山尽，\n", "黄河入[海]流。 "]},
        {"title": "缺", "paragraphs": None},
        {"title": "残", "paragraphs": ["□□依山尽，黄河入海流。"]},
    ]
    lines, counts = data.clean(raw, lambda s: s.replace("明", "看"))
    assert lines == ["床前看月光，疑是地上霜。", "白日依山尽，黄河入海流。"]
    assert (counts["read"], counts["dropped"], counts["written"]) == (7, 5, 2)
    assert counts["dropped_by_reason"] == {"no text": {"poems": 4, "indices": [1, 2, 3, 5]},
                                           "lost characters (□)": {"poems": 1, "indices": [6]}}
    assert counts["rules"] == {"notes in brackets": {"poems_changed": 1, "characters_removed": 13},
                               "emendation brackets": {"poems_changed": 1, "characters_removed": 2}}


def test_prepare_without_npm_says_the_corpus_is_already_there(tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RuntimeError) as info:
        data.prepare(data_dir=out)
    message = str(info.value)
    assert "npm" in message
    assert "already holds" in message
    assert f"data{os.sep}{data.CORPUS_FILE}" in message
    assert list(out.iterdir()) == []
