"""Fixes to the built pages. Links to notebooks that are not pages of the site become downloads of the notebook.

The lessons link to their exercise (`../exercises/01_reinforce.ipynb`), which the site does not render: a learner
works on it in Jupyter. MyST turns a link to any `.ipynb` into a reference to a page, and warns when there is no such
page; this transform, run while each page is read, makes such a link a download of the file instead (Sphinx copies it
into `_downloads/`), so the link works on the site as it does on disk.
"""

import posixpath
import re
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform


class NotebookLinksToDownloads(SphinxTransform):
    default_priority = 100

    def apply(self, **kwargs) -> None:
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("refdomain") != "doc" or node.get("reftype") != "myst" or node.get("reftargetid"):
                continue
            docname = node["reftarget"]
            if docname in self.env.found_docs:
                continue
            source = Path(self.env.srcdir) / f"{docname}.ipynb"
            if not source.is_file():
                continue
            download = addnodes.download_reference(
                "", "", *node.children, refdomain=None, reftype="myst", refexplicit=node.get("refexplicit", True),
                refdoc=node.get("refdoc", self.env.docname), reftarget=f"/{docname}.ipynb", classes=["download"])
            node.replace_self(download)
        # HTML that a cell printed (lesson 11's question index) links the Markdown files themselves: point such links
        # at the pages made from them
        here = posixpath.dirname(self.env.docname)

        def to_page(match: re.Match) -> str:
            target = posixpath.normpath(posixpath.join(here, match.group(2)))
            if target not in self.env.found_docs:
                return match.group(0)
            return f'{match.group(1)}{match.group(2)}.html{match.group(4) or ""}"'

        for node in list(self.document.findall(nodes.raw)):
            if node.get("format") == "html" and ".md" in node.astext():
                text = re.sub(r'(href=")([^":#]+)(\.md|\.ipynb)(#[^"]*)?"', to_page, node.astext())
                node.replace_self(nodes.raw("", text, format="html"))


def _drop_repeated_scripts(app, pagename, templatename, context, doctree) -> None:
    """sphinx-thebe and sphinx-togglebutton add their inline configuration twice in a Jupyter Book build; the second
    copy re-declares a `const` and the browser reports an error on every page. Keep the first of equal scripts."""
    scripts = context.get("script_files")
    if scripts:
        seen, unique = set(), []
        for script in scripts:
            # the copies differ only in filename None or "" (an inline script)
            key = (getattr(script, "filename", script) or "", repr(sorted(getattr(script, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                unique.append(script)
        scripts[:] = unique


def setup(app):
    app.add_transform(NotebookLinksToDownloads)
    app.connect("html-page-context", _drop_repeated_scripts, priority=999)  # after the handlers that add scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
