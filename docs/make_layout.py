"""Writes docs/LAYOUT.md, the package map, from the folders' __init__ docstrings and each module's first docstring
sentence. Run from the repository root: python docs/make_layout.py"""

import ast
import pathlib

out = [
    "# Where things live: the package map",
    "",
    "Every folder of `lathe/` opens its `__init__.py` with a paragraph saying what lives there and what it may",
    "import; this page gathers those paragraphs, with one line per module (the first sentence of its docstring).",
    "`tests/test_layout.py` keeps the arrows pointing one way (no import circles) and `lathe/train/` at 25",
    "entries or fewer. Regenerate it from the docstrings when folders change.",
    "",
]


def doc(p):
    d = ast.get_docstring(ast.parse(p.read_text())) or ""
    return " ".join(d.split())


def first(p):
    d = ast.get_docstring(ast.parse(p.read_text())) or ""
    line = " ".join(d.split("\n\n")[0].split())
    return line if len(line) < 150 else line[:147].rsplit(" ", 1)[0] + " ..."


for top in ["lathe/train", "lathe/llm"]:
    root = pathlib.Path(top)
    out += [f"## `{top}/`", "", doc(root / "__init__.py"), ""]
    out += [f"- `{p.name}`: {first(p)}" for p in sorted(root.glob("*.py")) if p.name != "__init__.py"]
    out.append("")
    for folder in sorted(d for d in root.iterdir() if d.is_dir() and (d / "__init__.py").exists()):
        out += [f"### `{folder}/`", "", doc(folder / "__init__.py"), ""]
        for sub in sorted(d for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").exists()):
            out += [f"- `{sub.name}/`: {first(sub / '__init__.py')}"]
        out += [f"- `{p.name}`: {first(p)}" for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"]
        out.append("")
pathlib.Path("docs/LAYOUT.md").write_text("\n".join(out).rstrip() + "\n")
