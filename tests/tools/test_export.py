"""``python -m kvlib export DIR``: the Hugging Face GPT-2 layout, loaded back by transformers and CTranslate2.

The exported folder must give our logits (within 1e-4) and our greedy tokens (up to near-ties) in
``transformers`` and, where it is installed, in CTranslate2; its tokenizer must give our ids and our text.
Bad input is refused naming the parameter (the command line: one line, status 2), and a failure
midway leaves nothing behind. Tests that load the folder need ``transformers`` (``pip install -e .[bench]``).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kvlib.decoding import generate
from kvlib.tools import export as export_module
from kvlib.tools.cli import main

from .test_cli import refused
from kvlib.tools.corpus import load_poems
from kvlib.tools.export import RECORD, export
from kvlib.verify import greedy_agreement

ATOL = 1e-4
NEW_TOKENS = 40
PROMPTS = ["床前明月光，", "白日依山尽，黄河入海流。欲穷千里", "春风", "大漠孤烟直，长河落日圆。"]
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed: pip install -e .[bench]")
FILES = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "README.md", RECORD}


@pytest.fixture(scope="module", params=["tang-char", "tang-bpe"])
def exported(request, tmp_path_factory):
    """(name, our model, our tokenizer, the exported folder), exported once per model."""
    from kvlib.tools.loading import load_pretrained

    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed: pip install -e .[bench]")
    name = request.param
    folder = export(name, None, tmp_path_factory.mktemp("export") / name)
    return (name, *load_pretrained(name), folder)


@pytest.fixture(scope="module")
def loaded(exported):
    """``exported`` with transformers' model and tokenizer loaded from the folder."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    name, model, tok, folder = exported
    return model, tok, GPT2LMHeadModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def prompt_ids(tok, text: str) -> list[int]:
    """A poem's opening as the models saw it in training: the separator first."""
    return [tok.eos_id] + tok.encode(text)


def known_poems(tok, n: int) -> list[str]:
    """The first ``n`` corpus poems that the tokenizer encodes (the char one refuses characters it lacks)."""
    return [p for p in load_poems()[: 4 * n] if not tok.unknown(p)][:n]


# ---- what the folder holds ----------------------------------------------------------------------

def test_the_folder_holds_the_gpt2_layout_and_the_sha256_of_every_file(exported):
    name, model, tok, folder = exported
    assert {p.name for p in folder.iterdir()} == FILES
    record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    assert record["model"] == name and set(record["files"]) == FILES - {RECORD}
    for file, entry in record["files"].items():
        data = (folder / file).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}, file
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    cfg = model.config
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["model_type"] == "gpt2"
    assert config["activation_function"] == "gelu"  # exact (erf) GELU, as our MLP
    assert (config["n_positions"], config["n_ctx"], config["n_embd"], config["n_layer"], config["n_head"],
            config["vocab_size"]) == (cfg.block_size, cfg.block_size, cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.vocab_size)
    assert config["layer_norm_epsilon"] == model.transformer.ln_f.eps == 1e-5
    assert config["bos_token_id"] == config["eos_token_id"] == tok.eos_id and config["tie_word_embeddings"] is True
    generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["eos_token_id"] == tok.eos_id and generation["temperature"] == 0.8
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert "vllm serve DIR" in readme and "from_pretrained" in readme


def test_the_weights_are_ours_under_transformers_names(exported):
    from safetensors.torch import load_file

    name, model, tok, folder = exported
    theirs = load_file(folder / "model.safetensors")
    ours = model.state_dict()
    assert torch.equal(theirs["transformer.wte.weight"], ours["transformer.wte.weight"])
    assert torch.equal(theirs["transformer.h.0.attn.c_attn.weight"], ours["transformer.h.0.attn.c_attn.weight"].t())
    assert torch.equal(theirs["transformer.h.3.mlp.c_proj.weight"], ours["transformer.h.3.mlp.c_proj.weight"].t())


# ---- transformers ---------------------------------------------------------------------------------

def test_transformers_gives_our_logits(loaded):
    model, tok, hf, _ = loaded
    for text in PROMPTS:
        idx = torch.tensor([prompt_ids(tok, text)])
        with torch.inference_mode():
            diff = (hf(idx).logits - model(idx)[0]).abs().max().item()
        assert diff <= ATOL, (text, diff)


def test_transformers_greedy_generation_writes_our_tokens(loaded):
    model, tok, hf, _ = loaded
    for text in PROMPTS:
        ids = prompt_ids(tok, text)
        idx = torch.tensor([ids])
        with torch.inference_mode():  # eos_token_id=[]: no stop at the separator, all 40 tokens compared
            theirs = hf.generate(idx, attention_mask=torch.ones_like(idx), do_sample=False, max_new_tokens=NEW_TOKENS,
                                 eos_token_id=[])[0, len(ids):].tolist()
        ours = generate(model, idx, NEW_TOKENS, temperature=0).new_tokens[0].tolist()
        assert len(theirs) == NEW_TOKENS
        assert greedy_agreement(model, ids, ours, theirs) in ("same", "near-tie"), text


def test_the_tokenizer_gives_our_ids_and_our_text(loaded):
    model, tok, _, hf_tok = loaded
    texts = known_poems(tok, 300) + ["\n".join(PROMPTS)]
    if tok.kind == "bpe":  # the pieces our encoder cuts: ASCII words, digits, runs of every kind of space
        texts += ["Hello  world 123\t\n x\u3000y\x1c z", "ab\r\ncd\u2028é", "  a  ", "春风 spring wind 2024"]
    for text in texts:
        assert hf_tok(text)["input_ids"] == tok.encode(text), text
        assert hf_tok.decode(tok.encode(text)) == text, text
    assert (hf_tok.eos_token_id, hf_tok.bos_token_id) == (tok.eos_id, tok.eos_id)


def test_a_character_outside_the_vocabulary_is_unk_in_the_export(loaded):
    model, tok, _, hf_tok = loaded
    if tok.kind != "char":
        pytest.skip("byte-level BPE has an id for every byte")
    assert hf_tok("床\u2603前")["input_ids"] == [tok.encode("床")[0], tok.unk_id, tok.encode("前")[0]]


# ---- CTranslate2 ----------------------------------------------------------------------------------

def test_ctranslate2_gives_our_logits_and_greedy_tokens(loaded, exported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed (pip install -e .[bench])")
    model, tok, _, hf_tok = loaded
    out = tmp_path / "ct2"
    ctranslate2.converters.TransformersConverter(str(exported[3])).convert(str(out))
    generator = ctranslate2.Generator(str(out), device="cpu")
    for text in PROMPTS:
        ids = prompt_ids(tok, text)
        theirs = torch.from_numpy(np.array(generator.forward_batch([ids])))  # (1, T, V) logits
        with torch.inference_mode():
            diff = (theirs - model(torch.tensor([ids]))[0]).abs().max().item()
        assert diff <= ATOL, (text, diff)
        result = generator.generate_batch([hf_tok.convert_ids_to_tokens(ids)], max_length=NEW_TOKENS, sampling_topk=1,
                                          include_prompt_in_result=False, end_token=[])
        written = result[0].sequences_ids[0]
        ours = generate(model, torch.tensor([ids]), NEW_TOKENS, temperature=0).new_tokens[0].tolist()
        assert len(written) == NEW_TOKENS
        assert greedy_agreement(model, ids, ours, written) in ("same", "near-tie"), text


# ---- a model object, bad input, failures ------------------------------------------------------------

@needs_transformers
def test_a_model_object_is_exported_with_its_tokenizer(tiny_gpt, tiny_char_tokenizer, tmp_path):
    from transformers import GPT2LMHeadModel

    folder = export(tiny_gpt, tiny_char_tokenizer, tmp_path / "tiny")
    assert json.loads((folder / RECORD).read_text(encoding="utf-8"))["model"] is None
    idx = torch.tensor([[0, 5, 9, 2]])
    with torch.inference_mode():
        diff = (GPT2LMHeadModel.from_pretrained(folder)(idx).logits - tiny_gpt(idx)[0]).abs().max().item()
    assert diff <= ATOL


@pytest.mark.parametrize("args, error, named", [
    (("tang-nothing", None, "x"), ValueError, "model"),
    ((42, None, "x"), TypeError, "model"),
    (("tang-char-gqa2", None, "x"), ValueError, "model"),
    (("tang-char-mla", None, "x"), ValueError, "model"),
    (("tang-char", "a tokenizer", "x"), ValueError, "tokenizer"),
    (("tang-char", None, 3), TypeError, "out_dir"),
    (("tang-char", None, ""), TypeError, "out_dir"),
])
def test_bad_arguments_are_refused_naming_the_parameter(tmp_path, args, error, named):
    model, tok, out = args
    with pytest.raises(error, match=rf"\b{named}\b"):
        export(model, tok, tmp_path / out if isinstance(out, str) and out else out)
    assert list(tmp_path.iterdir()) == []


def test_a_model_with_another_tokenizer_is_refused(tiny_gpt, bpe_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="does not belong"):
        export(tiny_gpt, bpe_tokenizer, tmp_path / "x")


def test_a_folder_with_files_is_refused_unless_overwrite(tmp_path):
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"out_dir .*overwrite=True.*--force"):
        export("tang-char", None, folder)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    with pytest.raises(NotADirectoryError, match="out_dir"):
        export("tang-char", None, folder / "notes.txt")
    with pytest.raises(TypeError, match="overwrite"):
        export("tang-char", None, folder, overwrite="yes")


@needs_transformers
def test_overwrite_replaces_the_folder_and_an_empty_one_is_used(tmp_path):
    folder = tmp_path / "taken"
    folder.mkdir()
    assert export("tang-char-draft", None, folder) == folder.resolve()  # empty: no overwrite needed
    (folder / "notes.txt").write_text("stale")
    export("tang-char-draft", None, folder, overwrite=True)
    assert {p.name for p in folder.iterdir()} == FILES
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no temporary, no set-aside copy


@needs_transformers
@pytest.mark.parametrize("step", ["write_tokenizer", "sync_folder", "move_into_place"])
def test_a_failure_midway_leaves_nothing_behind(monkeypatch, tmp_path, step):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, step, broken)
    with pytest.raises(OSError, match="disk full"):
        export("tang-char-draft", None, tmp_path / "new")
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old"
    old.mkdir()
    (old / "notes.txt").write_text("kept")
    with pytest.raises(OSError, match="disk full"):
        export("tang-char-draft", None, old, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"] and (old / "notes.txt").read_text() == "kept"


def test_a_failed_rename_puts_the_previous_folder_back(monkeypatch, tmp_path):
    old, staging = tmp_path / "old", tmp_path / "staging"
    for folder, file in ((old, "notes.txt"), (staging, "config.json")):
        folder.mkdir()
        (folder / file).write_text("x")
    real = os.replace

    def failing(src, dst):
        if Path(src) == staging:
            raise OSError("rename failed")
        real(src, dst)

    monkeypatch.setattr(export_module.os, "replace", failing)
    with pytest.raises(OSError, match="rename failed"):
        export_module.move_into_place(staging, old)
    assert [p.name for p in old.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "staging"]  # the caller removes staging


def test_without_transformers_the_error_names_the_extra(monkeypatch, tiny_gpt, tiny_char_tokenizer, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install -e \.\[bench\]"):
        export(tiny_gpt, tiny_char_tokenizer, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


# ---- the command line -----------------------------------------------------------------------------

def test_the_command_line_refuses_bad_folders_and_models_in_one_line(capsys, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    err = refused(capsys, ["export", str(taken)])
    assert err.startswith("python -m kvlib export: error: DIR ") and "--force" in err, err
    err = refused(capsys, ["export", str(taken / "notes.txt")])
    assert "is a file, not a folder" in err, err
    assert "invalid choice: 'tang-nothing'" in refused(capsys, ["export", str(tmp_path / "new"), "--model", "tang-nothing"])
    assert "the following arguments are required: DIR" in refused(capsys, ["export"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@needs_transformers
def test_the_command_line_writes_the_folder_and_says_how_to_load_it(capsys, tmp_path):
    assert main(["export", str(tmp_path / "out"), "--model", "tang-char-draft"]) == 0
    out = capsys.readouterr().out
    assert f"wrote tang-char-draft to {tmp_path / 'out'}" in out and "vllm serve" in out
    assert {p.name for p in (tmp_path / "out").iterdir()} == FILES
    assert main(["export", str(tmp_path / "out"), "--model", "tang-char-draft", "--force"]) == 0
