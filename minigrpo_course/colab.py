"""Open in Colab: a badge and a setup cell under the title of every notebook (``minigrpo colab``, maintainers).

Every lesson, deep dive, solution and exercise notebook carries two cells of this tool's, right under its title
cell (or at the top where the first cell is not a title):

- a Markdown cell with the "Open in Colab" badge, linking Colab to this very notebook in the repository at the
  pinned release (``https://colab.research.google.com/github/<owner>/<repo>/blob/<ref>/<path>``);
- a setup code cell. Where the course is importable (the checkout's environment, ``make setup``) it does nothing
  and prints nothing, so the committed outputs stay valid without re-running anything; it imports no module of
  the course (its code records no fingerprint, :mod:`minigrpo_course.provenance`). Anywhere else (Colab, a bare
  folder) it pip-installs the course pinned to the same release, fetches what that notebook needs beyond the
  package (:data:`NEEDS`: lesson 12's SmolLM2), and says which device the lesson will use: lessons pick CUDA
  themselves (``minigrpo.utils.get_device``), so on a Colab GPU runtime they run on it.

The repository and the release are written once, in ``pyproject.toml``: ``[project.urls] Repository`` and
``v<project.version>``. The tool rewrites its own cells (found by their ``metadata["minigrpo"]`` marker) and
touches nothing else: re-running it changes nothing (``--check`` says whether a run would).

``exercises/`` are generated from ``solutions/`` (``minigrpo make-exercises``), which points the badge of each
exercise at the exercise itself (:func:`retarget`); the tool covers ``exercises/`` too, with the same result.

This module imports nothing from ``minigrpo``: ``minigrpo colab --check`` answers at once.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

#: the cell metadata key that marks this tool's cells, and its two values
MARKER = "minigrpo"
BADGE, SETUP = "colab-badge", "colab-setup"
#: the folders whose notebooks carry the cells (relative to the checkout)
FOLDERS = ("notebooks", "notebooks/deep_dives", "solutions", "exercises")
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: what a notebook needs beyond the package, by notebook name: commands run with the kernel's Python (``-m ...``)
#: after the install, each with a line saying what it does. Every other lesson makes its data on the spot
#: (scikit-learn's bundled digits, generated tasks) and caches its own models on first use (lesson 08's base
#: denoiser, which lesson 09 and its deep dive load, is trained and cached the first time they ask for it).
NEEDS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "12_grpo_pretrained_model": [("fetching SmolLM2-135M-Instruct (93 MB, once)",
                                  ("-m", "minigrpo", "models", "fetch", "smollm2"))],
}


@dataclass(frozen=True)
class Release:
    """Where the course is published: ``https://github.com/<owner>/<name>`` at git ref ``ref``."""

    repository: str  #: ``https://github.com/owner/name``
    ref: str  #: a tag (``v0.1.0``) or a commit

    @property
    def owner_name(self) -> str:
        return self.repository.removeprefix("https://github.com/").strip("/")

    def requirement(self, extra: str) -> str:
        """The pip requirement of the course at this release, with ``extra``."""
        return f"minigrpo[{extra}] @ git+{self.repository}@{self.ref}"

    def colab_url(self, path: str) -> str:
        """Colab's address of the notebook at ``path`` (relative to the repository) at this release."""
        return f"https://colab.research.google.com/github/{self.owner_name}/blob/{self.ref}/{path}"


def release(root: Path, ref: str | None = None) -> Release:
    """The repository and release that ``root/pyproject.toml`` names: ``[project.urls] Repository`` and
    ``v<version>`` (``ref`` overrides the latter: a commit, another tag)."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    repository = project.get("urls", {}).get("Repository", "")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository):
        raise ValueError(f"pyproject.toml's [project.urls] Repository must be https://github.com/<owner>/<name>, "
                         f"not {repository!r}")
    return Release(repository, ref or f"v{project['version']}")


def badge_source(rel: Release, path: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({rel.colab_url(path)})"


def uses_gpu(nb) -> bool:
    """Whether the notebook's code picks its device (``get_device``: CUDA when there is one); the others (the
    control lessons, lesson 08's small denoiser, attention on the CPU) run on the CPU wherever they are."""
    return any(cell.cell_type == "code" and "get_device" in cell.source for cell in content_cells(nb))


def setup_source(rel: Release, path: str, gpu: bool = True) -> str:
    """The setup cell of the notebook at ``path``: nothing where the course is importable; elsewhere install the
    course at ``rel``, fetch what :data:`NEEDS` lists for it, and say where the notebook will run (``gpu``: it picks
    CUDA when there is one, else it runs on the CPU anyway)."""
    if gpu:
        device = f'''\
    import torch
    if torch.cuda.is_available():
        print(f"done; this notebook runs on the GPU ({{torch.cuda.get_device_name(0)}})")
    else:
        print("done; no GPU: this notebook runs on the CPU (Colab: Runtime > Change runtime type, then run all)")'''
    else:
        device = '    print("done; this notebook runs on the CPU, GPU or not (its models are small)")'
    needs = ""
    for what, command in NEEDS.get(Path(path).stem, []):
        args = ", ".join(f'"{a}"' for a in command)
        needs += f'    print("{what} ...", flush=True)\n    _run({args})\n'
    return f'''\
# Setup (written by `minigrpo colab`). In the course's own environment this cell does nothing. Opened on its own
# (Colab, a bare folder), it installs the course at the release this notebook belongs to and says where it runs.
import importlib.util, subprocess, sys
if importlib.util.find_spec("minigrpo_course") is None:
    def _run(*args):
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True)
        if done.returncode:
            print(done.stdout[-3000:] + done.stderr[-3000:])
            raise RuntimeError(f"`python {{' '.join(args)}}` failed (exit status {{done.returncode}}): see above")
    # Colab keeps its own Jupyter: the colab extra is the course's run-time packages without Jupyter's
    extra = "colab" if "google.colab" in sys.modules else "course"
    print("installing the course ({rel.ref}) ...", flush=True)
    _run("-m", "pip", "install", "-q", f"minigrpo[{{extra}}] @ git+{rel.repository}@{rel.ref}")
{needs}    importlib.invalidate_caches()
{device}'''


def colab_cells(rel: Release, path: str, gpu: bool = True) -> list:
    """The tool's two cells for the notebook at ``path`` (relative to the repository), with fixed ids (``gpu``: the
    notebook picks CUDA where there is one, :func:`uses_gpu`)."""
    import nbformat

    badge = nbformat.v4.new_markdown_cell(badge_source(rel, path), id=BADGE)
    badge.metadata = {MARKER: BADGE}
    setup = nbformat.v4.new_code_cell(setup_source(rel, path, gpu), id=SETUP)
    # remove-cell: the course website (Jupyter Book) leaves the setup out; Jupyter and Colab show it
    setup.metadata = {MARKER: SETUP, "tags": ["remove-cell"]}
    return [badge, setup]


def is_colab_cell(cell) -> bool:
    return cell.get("metadata", {}).get(MARKER) in (BADGE, SETUP)


def content_cells(nb) -> list:
    """The notebook's own cells: all but this tool's."""
    return [cell for cell in nb.cells if not is_colab_cell(cell)]


def _is_title(cell) -> bool:
    return cell.cell_type == "markdown" and cell.source.lstrip().startswith("# ")


def apply(nb, rel: Release, path: str):
    """A copy of ``nb`` with this tool's cells for ``path`` right under its title cell (at the top without one),
    replacing any it had; every other cell is kept as it is."""
    out = copy.deepcopy(nb)
    old = {cell.metadata[MARKER]: cell for cell in out.cells if is_colab_cell(cell)}
    fresh = colab_cells(rel, path, uses_gpu(nb))
    for cell in fresh:
        # what a run leaves on the setup cell (`minigrpo run` records execution times, a count) is kept: a notebook
        # re-executed in the course, where the cell does nothing, needs no update
        before = old.get(cell.metadata[MARKER])
        if before is not None:
            cell.metadata = {**before.metadata, **cell.metadata}
            if cell.cell_type == "code" and before.cell_type == "code":
                cell.execution_count, cell.outputs = before.execution_count, before.outputs
    cells = content_cells(out)
    at = 1 if cells and _is_title(cells[0]) else 0
    out.cells = cells[:at] + fresh + cells[at:]
    return out


_COLAB_URL = re.compile(r"https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/([^/\s)]+)/([^\s)]+)")


def badge_target(nb) -> tuple[Release, str] | None:
    """``(release, path)`` that the notebook's badge links to, or None when it has no badge of this tool's."""
    for cell in nb.cells:
        if cell.get("metadata", {}).get(MARKER) == BADGE and (m := _COLAB_URL.search(cell.source)):
            return Release(f"https://github.com/{m[1]}", m[2]), m[3]
    return None


def retarget(nb, path: str):
    """``nb`` with this tool's cells rewritten for ``path`` at the release its badge names (:func:`apply`), where it
    has them: a generated exercise carries its solution's cells, which must name the exercise. Needs no checkout
    (the release comes from the badge)."""
    target = badge_target(nb)
    return nb if target is None else apply(nb, target[0], path)


def notebook_paths(root: Path) -> list[Path]:
    """Every notebook of :data:`FOLDERS` under ``root``."""
    return sorted(p for folder in FOLDERS for p in (root / folder).glob("*.ipynb"))


def updated_text(path: Path, root: Path, rel: Release) -> tuple[str, str]:
    """``(now, wanted)``: the notebook's text, and its text with this tool's cells up to date."""
    import nbformat

    text = path.read_text(encoding="utf-8")
    wanted = nbformat.writes(apply(nbformat.reads(text, as_version=4), rel,
                                   path.resolve().relative_to(root.resolve()).as_posix()))
    return text, wanted if wanted.endswith("\n") else wanted + "\n"


def main(paths: list[str], check: bool = False, ref: str | None = None) -> int:
    """``minigrpo colab``: bring the cells up to date in ``paths`` (default: every notebook of :data:`FOLDERS`);
    with ``check``, only list the notebooks that a run would change (exit status 1 if any)."""
    from minigrpo_course.progress import repo_root

    root = repo_root()
    if not (root / "pyproject.toml").is_file():
        print(f"minigrpo colab: no pyproject.toml in {root}: run it inside the course's checkout")
        return 2
    try:
        rel = release(root, ref)
    except (KeyError, ValueError, tomllib.TOMLDecodeError) as exc:
        print(f"minigrpo colab: {exc}")
        return 2
    targets = [Path(p) for p in paths] or notebook_paths(root)
    changed = []
    for path in targets:
        if not path.is_file() or path.suffix != ".ipynb":
            print(f"minigrpo colab: {path} is not a notebook")
            return 2
        now, wanted = updated_text(path, root, rel)
        if now != wanted:
            changed.append(path)
            if not check:
                from minigrpo_course.state import atomic_write_text

                atomic_write_text(path, wanted)
    verb = "out of date" if check else "updated"
    for path in changed:
        print(f"{verb}: {path.resolve().relative_to(root.resolve()).as_posix()}")
    if not changed:
        print(f"all {len(targets)} notebooks have their Colab cells ({rel.ref})")
    return 1 if check and changed else 0
