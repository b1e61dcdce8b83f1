"""The optional compiled engine (docs/compiled.md): the hot modules built by
mypyc into build/compiled/ (`make compiled`), used only when
`DISAGG_SIM_COMPILED=1` (or a build directory) is in the environment.

The pure Python modules stay the reference: the build lives outside the
source tree, and this module puts a finder in front of the import system
that serves the built extension modules in place of their sources. It is
installed from engine/__init__.py, so before any engine module loads; the
other packages with compiled modules import `engine` first for the same
reason. A build is refused when any module of the compiled packages has
changed since it was built (the hashes in its manifest: the interpreted ones
too, which the compiled ones were type-checked against), and when a module it holds
was already imported from source (a process running part pure, part
compiled would measure neither). `build_label()` names what runs; run
results carry it (`extra["engine_build"]`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType

# (The rest is imported in `install`: a pure run pays nothing for this module.)

ENV = "DISAGG_SIM_COMPILED"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / "build" / "compiled"

_label = "pure"


class StaleBuildError(ImportError):
    """The compiled build does not match the sources (or is missing)."""


class _CompiledFinder:
    """Serves each compiled module's extension file (a meta path finder)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        import importlib.machinery
        import importlib.util

        loader = importlib.machinery.ExtensionFileLoader(fullname, file)
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def build_dir(value: str) -> Path:
    """`DISAGG_SIM_COMPILED`'s value: 1 for the default build directory, or a path."""
    return DEFAULT_DIR if value == "1" else Path(value)


def install(directory: Path) -> str:
    """Puts the build at `directory` in front of the import system; returns its label."""
    global _label
    import hashlib
    import importlib.machinery
    import json

    manifest_file = directory / "manifest.json"
    if not manifest_file.exists():
        raise StaleBuildError(f"{ENV}: no compiled build at {directory} (run `make compiled`, or unset {ENV})")
    manifest = json.loads(manifest_file.read_text())
    changed = [p for p, digest in manifest["sources"].items() if _sha256(REPO / p) != digest]
    if changed:
        raise StaleBuildError(
            f"{ENV}: the compiled build at {directory} is stale: {', '.join(changed[:5])}"
            f"{' …' if len(changed) > 5 else ''} changed since it was built (run `make compiled`, or unset {ENV})"
        )
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    files = {m: str(directory / "lib" / (m.replace(".", "/") + suffix)) for m in manifest["modules"]}
    missing = [m for m, f in files.items() if not Path(f).exists()]
    if missing:
        raise StaleBuildError(
            f"{ENV}: the build at {directory} has no {suffix} file for {missing[0]} "
            f"(built for Python {manifest['python']}; run `make compiled`)"
        )
    early = sorted(m for m in files if m in sys.modules)
    if early:
        raise StaleBuildError(f"{ENV}: {', '.join(early[:5])} imported from source before the compiled build")
    sys.meta_path.insert(0, _CompiledFinder(files))
    digest = hashlib.sha256(json.dumps(manifest["sources"], sort_keys=True).encode()).hexdigest()[:12]
    _label = f"compiled (mypyc {manifest['mypy']}, {len(manifest['compiled'])} modules, sources {digest})"
    print(f"disagg-sim: engine build: {_label}, from {directory}", file=sys.stderr)
    return _label


def build_label() -> str:
    """ "pure", or the compiled build's description."""
    return _label


def _sha256(path: Path) -> str | None:
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def install_from_environment() -> None:
    value = os.environ.get(ENV, "")
    if value not in ("", "0"):
        install(build_dir(value))
