"""Fixtures of the ABNet recipe tests: .mo catalogs written by the test itself and a small parallel corpus."""
from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest

# A small English->Spanish lexicon: phrases built from it translate word by word (with Spanish word order),
# which a tiny model can learn in a few dozen steps.
VERBS = {"open": "abrir", "close": "cerrar", "save": "guardar", "delete": "borrar", "show": "mostrar",
         "print": "imprimir", "copy": "copiar", "move": "mover"}
NOUNS = {"file": "archivo", "window": "ventana", "folder": "carpeta", "image": "imagen", "page": "página",
         "table": "tabla", "list": "lista", "menu": "menú"}
ADJS = {"new": "nueva", "old": "vieja", "current": "actual", "selected": "seleccionada", "empty": "vacía"}


def write_mo(path: Path, pairs: list[tuple[str, str]], big_endian: bool = False) -> Path:
    """Write a GNU .mo catalog holding a header entry plus `pairs` (msgid may carry 'ctx\\x04')."""
    entries = sorted([("", "Content-Type: text/plain; charset=UTF-8\n"), *pairs])
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    order = ">" if big_endian else "<"
    n = len(entries)
    off_ids = 28
    off_strs = off_ids + 8 * n
    data_start = off_strs + 8 * n
    blob = b""
    id_table, str_table = [], []
    for table, items in ((id_table, ids), (str_table, strs)):
        for s in items:
            table.append((len(s), data_start + len(blob)))
            blob += s + b"\0"
    head = struct.pack(order + "7I", 0x950412DE, 0, n, off_ids, off_strs, 0, 0)
    body = b"".join(struct.pack(order + "2I", *e) for e in id_table + str_table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + body + blob)
    return path


def corpus_pairs() -> list[tuple[str, str]]:
    """Clean phrase pairs: 'open the new file' -> 'abrir el archivo nueva' style, ~360 of them."""
    pairs = []
    for (v, vs), (n, ns) in itertools.product(VERBS.items(), NOUNS.items()):
        pairs.append((f"{v} {n}", f"{vs} {ns}"))
        for a, as_ in ADJS.items():
            pairs.append((f"{v} {a} {n}", f"{vs} {ns} {as_}"))
    return pairs


@pytest.fixture
def locale_dir(tmp_path: Path) -> Path:
    """A locale tree with two Spanish catalogs: the clean corpus plus messages the cleaner must drop."""
    root = tmp_path / "locale"
    noisy = [
        ("cannot open %s", "no se puede abrir %s"),
        ("<b>Bold</b> text", "texto <b>negrita</b>"),
        ("OK", "Aceptar"),  # too short
        ("  -h, --help     display this help", "  -h, --help     muestra esta ayuda"),
        ("line one\nline two", "línea uno\nlínea dos"),
        ("Untranslated", "Untranslated"),
        ("menu\x04_Quit program", "_Salir del programa"),  # context stripped, mnemonic removed
        ("a " * 40, "b " * 40),  # too long
    ]
    pairs = corpus_pairs()
    write_mo(root / "es" / "LC_MESSAGES" / "one.mo", pairs[: len(pairs) // 2] + noisy)
    write_mo(root / "es" / "LC_MESSAGES" / "two.mo", pairs[len(pairs) // 2 :] + [("open file", "abrir archivo")],
             big_endian=True)
    return root
