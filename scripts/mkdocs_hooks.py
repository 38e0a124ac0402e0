"""MkDocs hooks of the user guide (mkdocs.yml): the graph file schema
(opgraph/graph/schema/graph.schema.json) is published beside the pages as graph.schema.json."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

SCHEMA = Path(__file__).resolve().parents[1] / "opgraph" / "graph" / "schema" / "graph.schema.json"


def on_files(files: Files, config: dict) -> Files:
    files.append(File.generated(config, "graph.schema.json", content=SCHEMA.read_text()))
    return files
