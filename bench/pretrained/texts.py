"""The long texts the training-free tasks read, each pinned by the sha256 of its text (sources and
licences: docs/pretrained.md); a text whose hash differs is refused: a figure is only comparable on the same text."""

from __future__ import annotations

import bz2
import hashlib
import html
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.quality.data import bible, enwiki
from bench.quality.data.errors import DataMissingError

DOCS_COMMIT = "4760ab7ca62e7ee971297b37c70d6b0886984314"
_PAGE = re.compile(r"<page>.*?<title>(.*?)</title>.*?<text[^>]*>(.*?)</text>", re.S)


@dataclass(frozen=True)
class Document:
    """One long text with its source, licence and pinned sha256 (``None``: a user's file)."""

    name: str
    source: str
    licence: str
    sha256: str | None
    read: Callable[[], str]

    def text(self) -> str:
        """The text, checked against the pinned hash."""
        text = self.read()
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if self.sha256 is not None and digest != self.sha256:
            raise ValueError(f"document {self.name!r}: its text has sha256 {digest[:16]}..., the "
                             f"manifest pins {self.sha256[:16]}... ({self.source}); a figure is "
                             "only comparable on the same text")
        return text


def kjv_book(abbreviation: str) -> str:
    """One book of the KJV (``gen``, ``john``), verses cleaned as the translation task cleans them."""
    prefix = f"{abbreviation} "
    verses = [bible.clean(en, "en") for ref, en, _ in bible.load_parallel() if ref.startswith(prefix)]
    if not verses:
        raise ValueError(f"kjv: no book {abbreviation!r}")
    return " ".join(verses)


def longest_wikipedia_article() -> str:
    """The longest article of gensim's Wikipedia excerpt: title, then wikitext (entities unescaped)."""
    raw = bz2.decompress(enwiki.data_path().read_bytes()).decode("utf-8")
    title, body = max(((t, b) for t, b in _PAGE.findall(raw)), key=lambda page: len(page[1]))
    return f"{html.unescape(title)}\n\n{html.unescape(body)}"


def repository_docs(commit: str = DOCS_COMMIT) -> str:
    """``docs/*.md`` of this repository at ``commit``, in name order (``DataMissingError`` without the commit)."""
    root = Path(__file__).resolve().parents[2]
    what = f"attn-bench-docs: this repository's docs at commit {commit[:12]}"
    try:
        names = subprocess.run(["git", "ls-tree", "--name-only", commit, "docs/"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.split()
        parts = [subprocess.run(["git", "show", f"{commit}:{name}"], cwd=root, capture_output=True,
                                text=True, check=True).stdout
                 for name in sorted(names) if name.endswith(".md")]
    except (OSError, subprocess.CalledProcessError):
        raise DataMissingError(what, "git clone the attn-bench repository",
                               detail=f"no git history at {root}") from None
    return "\n\n".join(parts)


DOCUMENTS: dict[str, Document] = {
    doc.name: doc for doc in (
        Document("kjv-genesis", "Debian sword-text-kjv (engKJV2006eb), the book of Genesis",
                 "public domain",
                 "784f71e0ce1cc41bdfd6ed8d1b2d4f32c4411508d8374730b241a10daee47b02",
                 lambda: kjv_book("gen")),
        Document("enwiki-longest", "gensim's test data: the longest article of its Wikipedia "
                 "excerpt (enwiki-latest-pages-articles1, shortened)", "CC BY-SA 3.0",
                 "0cdde45866814514b6cb40641d2b5f9131b7aee2c48263faf504aa4fe9b6b6e7",
                 longest_wikipedia_article),
        Document("attn-bench-docs", f"this repository's docs/*.md at commit {DOCS_COMMIT[:12]}",
                 "MIT", "086b049308c83263bc64762ab3efb4e1c3b38b01565252406e718770fa80be0d",
                 repository_docs),
    )
}


def user_document(path: Path) -> Document:
    """A user's own UTF-8 text file as a document."""
    path = Path(path)

    def read() -> str:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"text: cannot read {path} as UTF-8 text ({err})") from None

    return Document(f"file:{path.name}", f"the user's file {path}", "the user's", None, read)


def document(name: str) -> Document:
    if name not in DOCUMENTS:
        raise ValueError(f"documents: unknown document {name!r}; known: {sorted(DOCUMENTS)} "
                         "(or a file with --text)")
    return DOCUMENTS[name]
