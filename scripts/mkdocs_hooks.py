"""MkDocs hooks of the user guide (mkdocs.yml).

- The graph file schema (opgraph/schema/graph.schema.json) is published beside the pages as
  graph.schema.json.
- docs/architecture.md, the page on the package's layers, is written with the restructuring of the
  package; until it exists, a page saying so stands in, so that the guide's links to it build under
  --strict."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

SCHEMA = Path(__file__).resolve().parents[1] / "opgraph" / "schema" / "graph.schema.json"

PLACEHOLDERS = {
    "architecture.md": "# Architecture\n\nThe page on opgraph's layers (core, graph, memory, engines, build, "
                       "runtime, tools) is being written with the package's restructuring.\n",
}


def on_files(files: Files, config: dict) -> Files:
    files.append(File.generated(config, "graph.schema.json", content=SCHEMA.read_text()))
    for uri, text in PLACEHOLDERS.items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=text))
    return files
