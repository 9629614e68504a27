"""``python -m kvlib export DIR``: a shipped model in the Hugging Face GPT-2 layout.

Our GPT already has GPT-2's shape (learned positions, pre-norm blocks, fused q/k/v, exact GELU, tied head),
so the export is a renaming: :func:`kvlib.tools.bench.to_transformers` puts the weights into a
``GPT2LMHeadModel`` and ``save_pretrained`` writes ``config.json`` and ``model.safetensors``. The tokenizer
becomes a ``tokenizer.json`` of the ``tokenizers`` library that gives exactly our ids: a WordLevel model
over the characters for ``tang-char``, byte-level BPE with our merges for ``tang-bpe``. The folder then
loads in ``transformers``, CTranslate2's converter and ``vllm serve DIR``.

Everything is written into a temporary folder beside ``DIR`` and renamed into place at the end, so a
failure leaves no half-written export; ``kvlib-export.json`` records the sha256 of every file.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch.nn as nn

from ..model import GPT, check_gpt
from ..tokenizer import ByteBPETokenizer, CharTokenizer, check_pair
from .bench import BENCH_EXTRA, to_transformers
from .integrity import sha256_file, write_json

RECORD = "kvlib-export.json"
# The sampling of ``python -m kvlib generate`` (README, "In the terminal"), as Hugging Face's generation config.
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "max_new_tokens": 64}


def export(model, tokenizer, out_dir, *, overwrite: bool = False) -> Path:
    """Write ``model`` to ``out_dir`` in the Hugging Face GPT-2 layout; return the folder's path.

    ``model`` is a shipped model's name such as ``"tang-char"`` (then ``tokenizer`` is None: its own is
    loaded) or a kvlib GPT with one key/value head per query head, and ``tokenizer`` its kvlib tokenizer.

    ``out_dir`` may be missing or empty; a folder with files in it is replaced only with ``overwrite=True``.
    Needs ``transformers`` (the ``bench`` extra). Raises TypeError or ValueError for a bad argument (naming
    it), FileExistsError for a non-empty ``out_dir`` and NotADirectoryError for a file in its place.
    """
    target = check_out_dir(out_dir, overwrite)  # first: a taken folder is refused before anything is loaded
    name, model, tokenizer = resolve_model(model, tokenizer)
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None:
        raise ImportError(f"the export needs transformers (and its tokenizers): {BENCH_EXTRA}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        write_model(model, tokenizer, staging)
        write_tokenizer(tokenizer, model.config.block_size, staging)
        (staging / "README.md").write_text(readme_text(name, model, tokenizer), encoding="utf-8")
        write_json(staging / RECORD, {"model": name, "tokenizer": tokenizer.kind,
                                      "files": {f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size}
                                                for f in sorted(staging.iterdir())}})
        sync_folder(staging)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is private; the export is an ordinary folder
        move_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the rename succeeded
    return target


def resolve_model(model, tokenizer) -> tuple[str | None, GPT, CharTokenizer | ByteBPETokenizer]:
    """(shipped name or None, model, tokenizer): a name is loaded with its own tokenizer; a GPT needs one."""
    from .loading import MODELS, load_pretrained

    name = None
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"model: unknown model {model!r}; the shipped models are {', '.join(MODELS)}")
        if tokenizer is not None:
            raise ValueError(f"tokenizer: pass None with a shipped model's name ({model!r} brings its own tokenizer)")
        name, (model, tokenizer) = model, load_pretrained(model)
    check_gpt(model)
    check_pair(model, tokenizer)
    if not isinstance(tokenizer, (CharTokenizer, ByteBPETokenizer)):
        raise TypeError(f"tokenizer must be a kvlib CharTokenizer or ByteBPETokenizer, got {type(tokenizer).__name__}")
    cfg = model.config
    if not cfg.multi_head:
        kind = (f"a {cfg.kv_latent}-number latent in place of keys and values" if cfg.kv_latent
                else f"{cfg.kv_heads} key/value head{'s' * (cfg.kv_heads != 1)} for {cfg.n_head} query heads")
        raise ValueError(f"model: {name or 'this model'} keeps {kind}; GPT-2's layout has one key/value "
                         f"head per query head (export tang-char, tang-bpe or tang-char-draft)")
    if model.lm_head.weight is not model.transformer.wte.weight:
        raise ValueError("model: its head is not tied to the token embedding, as the GPT-2 layout written here is")
    return name, model, tokenizer


def check_out_dir(out_dir, overwrite: bool) -> Path:
    """The folder to write: missing, empty, or (with ``overwrite``) to be replaced; never a file."""
    if not isinstance(out_dir, (str, os.PathLike)) or str(out_dir) == "":
        raise TypeError(f"out_dir must be a folder path (str or os.PathLike), got {out_dir!r:.60}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {type(overwrite).__name__}")
    target = Path(out_dir).expanduser().resolve()  # a symlink names the folder it points to
    if target.parent == target:
        raise ValueError(f"out_dir {out_dir} is a file system's root: name a folder inside it")
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"out_dir {out_dir} is a file, not a folder: name a new or empty folder to export into")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"out_dir {out_dir} exists and is not empty: pass overwrite=True (--force on the "
                              f"command line) to replace it, or name a new folder")
    return target


def write_model(model: GPT, tokenizer, folder: Path) -> None:
    """config.json, model.safetensors and generation_config.json, through ``to_transformers``."""
    from transformers.utils import logging

    hf = to_transformers(model)
    eps = {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}
    if eps != {hf.config.layer_norm_epsilon}:
        raise ValueError(f"model: its layer norms use eps {sorted(eps)}, not {hf.config.layer_norm_epsilon}")
    sep = tokenizer.eos_id  # the poem separator starts and ends every poem
    hf.config.bos_token_id = hf.config.eos_token_id = sep
    hf.config.n_ctx = model.config.block_size
    hf.config.architectures = ["GPT2LMHeadModel"]
    gen = hf.generation_config
    gen.bos_token_id = gen.eos_token_id = gen.pad_token_id = sep
    for key, value in SAMPLING.items():
        setattr(gen, key, value)
    save, bars = hf.save_pretrained, logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # one small file: no "Writing model shards" bar
    try:
        save(folder, **({"safe_serialization": True} if "safe_serialization" in inspect.signature(save).parameters else {}))
    finally:
        if bars:
            logging.enable_progress_bar()
    if not (folder / "model.safetensors").is_file():
        raise RuntimeError(f"transformers wrote no model.safetensors into {folder}: "
                           f"{sorted(p.name for p in folder.iterdir())}")


def write_tokenizer(tokenizer, block_size: int, folder: Path) -> None:
    """tokenizer.json (the ``tokenizers`` library's format), tokenizer_config.json and special_tokens_map.json."""
    if isinstance(tokenizer, CharTokenizer):
        backend, special = char_backend(tokenizer), {"bos_token": tokenizer.itos[tokenizer.eos_id],
                                                     "eos_token": tokenizer.itos[tokenizer.eos_id],
                                                     "unk_token": CharTokenizer.UNK}
    else:
        # As in GPT-2, <|endoftext|> also stands as the unknown token, which byte-level BPE never needs.
        backend, special = bpe_backend(tokenizer), dict.fromkeys(("bos_token", "eos_token", "unk_token"),
                                                                 ByteBPETokenizer.EOT)
    backend.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", **special, "model_max_length": block_size,
        "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False})
    write_json(folder / "special_tokens_map.json", special)


def char_backend(tokenizer: CharTokenizer):
    """One id per character: every character is its own piece, looked up in the table (``<unk>`` if absent);
    decoding joins the pieces with nothing between them. The separator is a special token, as our eos."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({ch: i for i, ch in enumerate(tokenizer.itos)}, unk_token=CharTokenizer.UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")  # any character, a newline too
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(tokenizer.itos[tokenizer.eos_id], special=True, normalized=False),
                                AddedToken(CharTokenizer.UNK, special=True, normalized=False)])
    return backend


def byte_symbols() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character (printable bytes as themselves,
    the rest shifted past 255), which is how a byte-level BPE vocabulary writes its tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}


def bpe_backend(tokenizer: ByteBPETokenizer):
    """Byte-level BPE with our merges, in our order: the text is first cut into pieces as our encoder cuts it
    (runs of ASCII letters, of digits, of whitespace; any other character alone), then each piece's bytes
    are merged by rank. ``<|endoftext|>`` keeps its id as a special token."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    sym = byte_symbols()
    spell = ["".join(sym[b] for b in token) for token in tokenizer.vocab]
    merges = [(spell[a], spell[b]) for a, b in tokenizer.merges]
    backend = Tokenizer(models.BPE({s: i for i, s in enumerate(spell)}, merges))
    # Python's \s (str.isspace) spelled out: the regex engine of tokenizers may read \s otherwise.
    space = "".join(ch for ch in map(chr, range(0x110000)) if ch.isspace())
    chunks = Regex(f"[A-Za-z]+|[0-9]+|[{space}]+|.|\n")
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(chunks, behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(ByteBPETokenizer.EOT, special=True, normalized=False)])
    return backend


def readme_text(name: str | None, model: GPT, tokenizer) -> str:
    """The export's own README: what the folder holds and how to load it."""
    cfg, title = model.config, name or "a kvlib GPT"
    if tokenizer.kind == "char":
        ids = (f"{cfg.vocab_size:,} ids, one per character; a character outside the vocabulary becomes `<unk>` "
               f"(id {tokenizer.unk_id}) here, where kvlib refuses the text")
        eos = "a new line (`\\n`)"
    else:
        ids = (f"{cfg.vocab_size:,} ids of byte-level BPE; kvlib decodes id {tokenizer.eos_id} as a new line, "
               f"the tokenizer here as `{ByteBPETokenizer.EOT}`")
        eos = f"`{ByteBPETokenizer.EOT}`"
    return f"""# {title}, in the Hugging Face GPT-2 layout

A small GPT trained on the Complete Tang Poems with kvlib, exported by `python -m kvlib export`:
{cfg.n_layer} layer{"s" * (cfg.n_layer != 1)}, {cfg.n_embd} dimensions, {cfg.n_head} heads, learned positions for a
block of {cfg.block_size} tokens, exact (erf) GELU, the head tied to the token embedding; {ids}.
Poems are separated by {eos} (id {tokenizer.eos_id}), which is also the beginning- and end-of-sequence
token: start a prompt with it, as every poem started in training.

Files: `config.json` and `model.safetensors` (`GPT2LMHeadModel`), `generation_config.json` (the sampling of
`python -m kvlib generate`: temperature 0.8, top-k 40, top-p 0.95, 64 new tokens), `tokenizer.json`,
`tokenizer_config.json` and `special_tokens_map.json` (the ids of kvlib's tokenizer), and
`{RECORD}` (the sha256 of every other file). Below, DIR is this folder.

```python
from transformers import AutoTokenizer, GPT2LMHeadModel
tok = AutoTokenizer.from_pretrained("DIR")
model = GPT2LMHeadModel.from_pretrained("DIR")
ids = tok(tok.eos_token + "床前明月光，", return_tensors="pt").input_ids
print(tok.decode(model.generate(ids, max_new_tokens=24, do_sample=False)[0], skip_special_tokens=True))
```

Serving: `vllm serve DIR` (an OpenAI-compatible server; the context is {cfg.block_size} tokens), or, for
CTranslate2, `ct2-transformers-converter --model DIR --output_dir DIR-ct2`.
"""


def sync_folder(folder: Path) -> None:
    """Every file in ``folder`` on disk before the rename makes it visible."""
    for path in folder.iterdir():
        with open(path, "r+b") as f:  # writable: Windows syncs only files open for writing
            os.fsync(f.fileno())


def move_into_place(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; a folder already there is set aside first and removed only once the
    new one is in place (put back if the rename fails)."""
    aside = None
    if target.exists():
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".old"))
        try:
            os.replace(target, aside / "previous")
        except BaseException:
            shutil.rmtree(aside, ignore_errors=True)
            raise
    try:
        os.replace(staging, target)
    except BaseException:
        if aside is not None:
            os.replace(aside / "previous", target)
            shutil.rmtree(aside, ignore_errors=True)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def summary(folder: Path) -> str:
    """What ``python -m kvlib export`` prints: the folder, its files and sizes, and how to load it."""
    record = json.loads((Path(folder) / RECORD).read_text(encoding="utf-8"))
    files = ", ".join(f"{name} ({entry['bytes']:,} bytes)" for name, entry in record["files"].items())
    return (f"wrote {record['model'] or 'the model'} to {folder}: {files}, {RECORD} (sha256 of each)\n"
            f"load it with transformers (GPT2LMHeadModel / AutoTokenizer .from_pretrained(\"{folder}\")) "
            f"or serve it with: vllm serve {folder}")
