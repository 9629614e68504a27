"""Build the CJK font that ``kvlib.notebook.plots`` draws with.

The shipped file ``data/fonts/NotoSansCJKsc-Regular-subset.otf`` is face 2 (Simplified Chinese) of
``NotoSansCJK-Regular.ttc`` from Debian's ``fonts-noto-cjk`` package, cut down with fontTools'
``pyftsubset`` to the corpus's characters, ASCII and a few symbols that plots use. It is licensed
under the SIL Open Font License 1.1 (``data/fonts/LICENSE-OFL.txt``).

    apt-get download fonts-noto-cjk && dpkg-deb -x fonts-noto-cjk_*.deb deb
    python -m kvlib.tools.fonts deb/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc --record

Noto Sans CJK lacks some rare ideographs (CJK Extension B and later). The fallback fonts fill those
in: HanaMinA and HanaMinB from Debian's ``fonts-hanazono`` (SIL OFL 1.1, with reserved font names,
so the subsets are renamed "kvlib Fallback Han A/B"), cut to the corpus characters Noto lacks::

    apt-get download fonts-hanazono && dpkg-deb -x fonts-hanazono_*.deb deb
    python -m kvlib.tools.fonts --fallback deb/usr/share/fonts/truetype/hanazono --record

Needs the optional dependency ``fonttools`` (``pip install -e .[fonts]``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from .integrity import DATA_DIR, record, write_bytes

FONT_FILE = "fonts/NotoSansCJKsc-Regular-subset.otf"
LICENSE_FILE = "fonts/LICENSE-OFL.txt"
FONT_NUMBER = 2  # faces in the .ttc: 0 JP, 1 KR, 2 SC, 3 TC, 4 HK, then the Mono ones
ASCII = "".join(chr(i) for i in range(0x20, 0x7F))
# Symbols that labels, titles and notebook prose put into plots.
EXTRA = (
    "…×÷±≈≠≤≥→←↑↓⇒°−–—·•‰∞√∑∫≪≫✓✗⏎␣"
    "αβγδεθλμπρστφω"
    "，。、！？；：「」『』（）《》〈〉【】“”‘’～"
)
NAME_IDS = "0,1,2,3,4,5,6,13,14"  # keep the copyright and licence records, not only the names
FALLBACK_FILES = {"HanaMinA.ttf": "fonts/FallbackHanA-subset.ttf", "HanaMinB.ttf": "fonts/FallbackHanB-subset.ttf"}
FALLBACK_LICENSE = "fonts/LICENSE-Hanazono.txt"


def subset_text(corpus: str | None = None) -> str:
    """The characters to keep: those of the corpus, ASCII and EXTRA, sorted, without newline."""
    if corpus is None:
        from .corpus import load_text

        corpus = load_text()
    return "".join(sorted((set(corpus) | set(ASCII) | set(EXTRA)) - {"\n", "\r"}))


def subset_args(source_ttc: str | os.PathLike, text_file: str | os.PathLike, out_file: str | os.PathLike) -> list[str]:
    """The ``pyftsubset`` command line (without the program name) that ``build_subset`` runs."""
    return [str(source_ttc), f"--font-number={FONT_NUMBER}", f"--text-file={text_file}",
            f"--name-IDs={NAME_IDS}", f"--output-file={out_file}"]


def build_subset(source_ttc: str | os.PathLike, out_path: str | os.PathLike = DATA_DIR / FONT_FILE,
                 text: str | None = None) -> Path:
    """Subset face 2 of ``source_ttc`` to ``text`` (default: :func:`subset_text`); write ``out_path`` atomically."""
    from fontTools import subset

    out_path = Path(out_path)
    text = subset_text() if text is None else text
    with tempfile.TemporaryDirectory() as tmp:
        text_file, out_file = Path(tmp) / "chars.txt", Path(tmp) / "subset.otf"
        text_file.write_text(text, encoding="utf-8")
        status = subset.main(subset_args(source_ttc, text_file, out_file))
        if status:
            raise RuntimeError(f"pyftsubset failed with status {status}")
        write_bytes(out_path, out_file.read_bytes())
    return out_path


def build_fallback(hanazono_dir: str | os.PathLike, corpus: str | None = None) -> list[Path]:
    """Subset HanaMinA/B to the corpus characters the Noto subset lacks, renamed; write them atomically."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    from .integrity import verified_path

    noto = set(TTFont(verified_path(FONT_FILE))["cmap"].getBestCmap())
    wanted = {ord(c) for c in subset_text(corpus)} - noto
    written = []
    for source, target in FALLBACK_FILES.items():
        font = TTFont(Path(hanazono_dir) / source)
        chars = sorted(wanted & set(font.getBestCmap()))
        wanted -= set(chars)
        with tempfile.TemporaryDirectory() as tmp:
            text_file, out_file = Path(tmp) / "chars.txt", Path(tmp) / "subset.ttf"
            text_file.write_text("".join(map(chr, chars)), encoding="utf-8")
            status = subset.main([str(Path(hanazono_dir) / source), f"--text-file={text_file}",
                                  f"--name-IDs={NAME_IDS}", f"--output-file={out_file}"])
            if status:
                raise RuntimeError(f"pyftsubset failed with status {status}")
            sub = TTFont(out_file)
            family = "kvlib Fallback Han " + source[len("HanaMin"):-len(".ttf")]  # the OFL's reserved names stay out
            for record_ in sub["name"].names:
                if record_.nameID in (1, 4, 16):
                    record_.string = family
                elif record_.nameID == 6:
                    record_.string = family.replace(" ", "")
            sub["OS/2"].usWeightClass = 400  # "regular", like the Noto subset, so matplotlib pairs them
            sub.save(out_file)
            write_bytes(DATA_DIR / target, out_file.read_bytes())
        written.append(DATA_DIR / target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlib.tools.fonts", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", help="NotoSansCJK-Regular.ttc from Debian's fonts-noto-cjk package")
    parser.add_argument("--fallback", metavar="DIR", help="build the fallback subsets from the folder of HanaMinA/B.ttf")
    parser.add_argument("--out", default=str(DATA_DIR / FONT_FILE), help="where to write the subset (.otf)")
    parser.add_argument("--record", action="store_true",
                        help="write the font's and its licence's sha256 into data/MANIFEST.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.fallback:
        paths = build_fallback(args.fallback)
        for p in paths:
            print(f"{p}: {p.stat().st_size / 1e3:.0f} KB")
        if args.record:
            record(*paths, DATA_DIR / FALLBACK_LICENSE)
        return 0
    if not args.source:
        parser.error("give the Noto .ttc, or --fallback DIR")
    text = subset_text()
    out = build_subset(args.source, args.out, text)
    print(f"{out}: {out.stat().st_size / 1e6:.1f} MB, {len(text)} characters requested, "
          f"{time.perf_counter() - start:.1f} s")
    if args.record:
        record(out, DATA_DIR / LICENSE_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
