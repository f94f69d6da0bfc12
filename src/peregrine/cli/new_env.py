"""`peregrine new-env NAME [--multi-agent] [--dir DIR]`: a working C env package.

Writes DIR/NAME (default ./NAME), outside Peregrine, with every file an env needs:

    NAME/NAME.h          the env: every contract function filled in (pg_env.h)
    NAME/__init__.py     its NativeEnv class (header, shipped training config)
    NAME/reference.py    the same rules in NumPy, bit for bit
    NAME/train.toml      the config `peregrine train NAME` starts from
    NAME/render.py       (--multi-agent) its frames, for `peregrine render NAME`
    tests/test_NAME.py   check_env and C/NumPy parity
    pyproject.toml       a package whose entry point registers the env with Peregrine
    setup.py             builds the header with peregrine.envs.sdk.extension

The single-agent env reaches a target on a line (Discrete actions); with
--multi-agent, pursuers tag an evader on a plane (continuous actions, one row per
pursuer). Then `pip install --no-build-isolation ./NAME` and `peregrine train NAME`.
"""
from __future__ import annotations

import keyword
import os
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"

# file written -> template (the kind's own where one exists: single_* / multi_*)
FILES = {
    "{name}/{name}.h": "{kind}.h.tmpl",
    "{name}/__init__.py": "init.py.tmpl",
    "{name}/reference.py": "{kind}_reference.py.tmpl",
    "{name}/train.toml": "{kind}_train.toml.tmpl",
    "tests/test_{name}.py": "test.py.tmpl",
    "pyproject.toml": "pyproject.toml.tmpl",
    "setup.py": "setup.py.tmpl",
}
# files of one kind only
KIND_FILES = {"multi": {"{name}/render.py": "multi_render.py.tmpl"}}
RENDERER_LINE = ('    renderer = "{name}.render"        # rgb_frame: `peregrine render {name}` '
                 'draws with it\n')


def add_arguments(parser) -> None:
    parser.add_argument("name", help="the env's name: lower-case letters, digits, underscores")
    parser.add_argument("--multi-agent", action="store_true",
                        help="a multi-agent env (pursuers and an evader) instead of one agent")
    parser.add_argument("--dir", default=".", help="where to create the NAME folder (default .)")


def write(name: str, directory, multi_agent: bool = False) -> Path:
    """Writes the package of env `name` into directory/name; returns that folder."""
    from ..envs.registry import ENVS
    from ..envs.sdk import check_name
    check_name(name)
    if keyword.iskeyword(name):
        raise ValueError(f"{name!r} is a Python keyword: the env is a Python package of that "
                         f"name, which `import {name}` could not load; choose another name")
    if name in ENVS:
        raise ValueError(f"{name!r} is already an env ({ENVS.entry(name).source}); choose "
                         f"another name")
    root = Path(directory) / name
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} exists and is not empty; choose another --dir or name")
    kind = "multi" if multi_agent else "single"
    extra = KIND_FILES.get(kind, {})
    words = {"{{renderer}}": RENDERER_LINE.format(name=name) if extra else "",
             "{{name}}": name, "{{NAME}}": name.upper(),
             "{{Class}}": "".join(part.title() for part in name.split("_"))}
    for target, template in {**FILES, **extra}.items():
        text = (TEMPLATES / template.format(kind=kind)).read_text()
        for word, value in words.items():
            text = text.replace(word, value)
        path = root / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def run(args) -> int:
    root = write(args.name, args.dir, args.multi_agent)
    # a folder pip cannot mistake for a package name on the index: ./NAME, not NAME
    shown = str(root) if root.is_absolute() or len(root.parts) > 1 else f".{os.sep}{root}"
    print(f"wrote {root}: edit {args.name}/{args.name}.h (the rules) and reference.py, then\n"
          f"  pip install --no-build-isolation {shown}\n"
          f"  python -m pytest {root / 'tests'}\n"
          f"  peregrine train {args.name}")
    return 0
